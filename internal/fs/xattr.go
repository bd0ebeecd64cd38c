package fs

import (
	"context"
	"fmt"
	"strings"
	"syscall"

	"github.com/arbor-storage/arbor/internal/btree/tuple"
)

// Extended attribute flags (setxattr(2)).
const (
	XattrCreate  = 1
	XattrReplace = 2
)

func checkXattrName(name string) error {
	switch {
	case name == "":
		return errf(syscall.EINVAL, "empty attribute name")
	case len(name) > maxXattrNameBytes:
		return errf(syscall.ERANGE, "attribute name of %d bytes (the bound is %d)", len(name), maxXattrNameBytes)
	case strings.IndexByte(name, 0) >= 0:
		return errf(syscall.EINVAL, "attribute name holds NUL")
	}
	return nil
}

// GetXattr returns the value of h's attribute name (ENODATA if absent).
func (f *FS) GetXattr(ctx context.Context, h Handle, name string) ([]byte, error) {
	if err := checkXattrName(name); err != nil {
		return nil, err
	}
	var out []byte
	err := f.view(ctx, func(tx MetaTxn, s uint64) error {
		v, payload, err := readAt(tx, f.keys.xattr(h, name), s)
		if err != nil {
			return err
		}
		if !v.live() {
			if _, err := readInode(tx, f.keys, h, s); err != nil {
				return err
			}
			return errf(syscall.ENODATA, "attribute %q of %v", name, h)
		}
		out = append([]byte{}, payload...)
		return nil
	})
	return out, err
}

// ListXattr returns the names of h's attributes.
func (f *FS) ListXattr(ctx context.Context, h Handle) ([]string, error) {
	if _, err := f.GetAttr(ctx, h); err != nil {
		return nil, err
	}
	prefix := f.keys.xattrPrefix(h)
	var names []string
	err := f.scanAt(ctx, prefix, endOf(prefix), f.readAt, func(p []byte, v version, _ []byte) error {
		if !v.live() {
			return nil
		}
		t, err := tuple.Unpack(p)
		if err != nil || len(t) != 6 {
			return fmt.Errorf("%w: attribute key %x", errCorrupt, p)
		}
		b, ok := t[5].([]byte)
		if !ok {
			return fmt.Errorf("%w: attribute key %x", errCorrupt, p)
		}
		names = append(names, string(b))
		return nil
	})
	return names, err
}

// SetXattr sets h's attribute name to value.
func (f *FS) SetXattr(ctx context.Context, h Handle, name string, value []byte, flags uint32) error {
	if err := checkXattrName(name); err != nil {
		return err
	}
	if len(value) > maxXattrValueBytes {
		return errf(syscall.E2BIG, "attribute value of %d bytes (the bound is %d)", len(value), maxXattrValueBytes)
	}
	if flags&^(XattrCreate|XattrReplace) != 0 || flags == XattrCreate|XattrReplace {
		return errf(syscall.EINVAL, "setxattr flags %#x", flags)
	}
	return f.update(ctx, func(w *wtx) error {
		icur, n, err := w.inode(f.keys, h)
		if err != nil {
			return err
		}
		key := f.keys.xattr(h, name)
		cur, _, err := w.current(key)
		if err != nil {
			return err
		}
		switch {
		case cur.live() && flags&XattrCreate != 0:
			return errf(syscall.EEXIST, "attribute %q of %v", name, h)
		case !cur.live() && flags&XattrReplace != 0:
			return errf(syscall.ENODATA, "attribute %q of %v", name, h)
		}
		if !cur.live() {
			if n.Xattrs >= maxXattrsPerObject {
				return errf(syscall.ENOSPC, "object %v has %d attributes (the bound is %d)", h, n.Xattrs, maxXattrsPerObject)
			}
			n.Xattrs++
		}
		n.Ctime = f.opNow(ctx).UnixNano()
		if err := w.put(key, cur, value); err != nil {
			return err
		}
		return w.setInode(f.keys, h, icur, n)
	})
}

// RemoveXattr removes h's attribute name (ENODATA if absent).
func (f *FS) RemoveXattr(ctx context.Context, h Handle, name string) error {
	if err := checkXattrName(name); err != nil {
		return err
	}
	return f.update(ctx, func(w *wtx) error {
		icur, n, err := w.inode(f.keys, h)
		if err != nil {
			return err
		}
		key := f.keys.xattr(h, name)
		cur, _, err := w.current(key)
		if err != nil {
			return err
		}
		if !cur.live() {
			return errf(syscall.ENODATA, "attribute %q of %v", name, h)
		}
		if n.Xattrs == 0 {
			return fmt.Errorf("%w: object %v counts no attributes but has %q", errCorrupt, h, name)
		}
		n.Xattrs--
		n.Ctime = f.opNow(ctx).UnixNano()
		if err := w.del(key, cur); err != nil {
			return err
		}
		return w.setInode(f.keys, h, icur, n)
	})
}

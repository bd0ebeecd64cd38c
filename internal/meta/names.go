package meta

import (
	"unicode"
	"unicode/utf8"

	"github.com/arbor-storage/arbor/internal/directory"
)

// CheckFileSystemName says what is wrong with a file system's name, or nil.
// A name is how mounts, gateways and paths (an NFS export /NAME) find the
// file system, so it must be printable as it is: UTF-8 without spaces or
// control characters, no '/', not "." or "..". The client checks it before
// sending (a string that is not UTF-8 cannot even be marshaled) and the
// server again.
func CheckFileSystemName(name string) error {
	switch {
	case name == "":
		return invalidf("a file system needs a name")
	case len(name) > directory.MaxFileSystemNameBytes:
		return invalidf("a file system name of %d bytes (the bound is %d)", len(name), directory.MaxFileSystemNameBytes)
	case !utf8.ValidString(name):
		return invalidf("file system name %q is not UTF-8", name)
	case name == "." || name == "..":
		return invalidf("%q cannot name a file system", name)
	}
	for _, r := range name {
		if r == '/' || unicode.IsSpace(r) || !unicode.IsPrint(r) {
			return invalidf("file system name %q contains %q (no '/', spaces or control characters)", name, r)
		}
	}
	return nil
}

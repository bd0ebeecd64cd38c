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
func CheckFileSystemName(name string) error { return checkName("file system", name) }

// CheckSnapshotName says what is wrong with a snapshot's name, or nil: the
// rules of CheckFileSystemName, since a snapshot is mounted, listed and
// reached through a gateway by its name as a file system is. The client
// and the server (createSnapshot) both check it.
func CheckSnapshotName(name string) error { return checkName("snapshot", name) }

// checkName checks the name of a what ("file system", "snapshot").
func checkName(what, name string) error {
	switch {
	case name == "":
		return invalidf("a %s needs a name", what)
	case len(name) > directory.MaxFileSystemNameBytes:
		return invalidf("a %s name of %d bytes (the bound is %d)", what, len(name), directory.MaxFileSystemNameBytes)
	case !utf8.ValidString(name):
		return invalidf("%s name %q is not UTF-8", what, name)
	case name == "." || name == "..":
		return invalidf("%q cannot name a %s", name, what)
	}
	for _, r := range name {
		if r == '/' || unicode.IsSpace(r) || !unicode.IsPrint(r) {
			return invalidf("%s name %q contains %q (no '/', spaces or control characters)", what, name, r)
		}
	}
	return nil
}

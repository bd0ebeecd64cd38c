package buildinfo

import (
	"fmt"
	"runtime"
	"runtime/debug"
)

// version is set at link time:
//
//	go build -ldflags "-X github.com/arbor-storage/arbor/internal/buildinfo.version=v1.2.3"
//
// It is a link-time constant, not mutable state: nothing assigns it at run
// time.
var version string

// develVersion is what the Go toolchain records for a build from a work tree.
const develVersion = "(devel)"

// Info describes one build of arbor.
type Info struct {
	// Version is the release version, or "(devel)" for a work-tree build.
	Version string `json:"version"`
	// Revision is the VCS commit the build came from, if the toolchain
	// recorded it (builds with -buildvcs=false do not).
	Revision string `json:"revision,omitempty"`
	// RevisionTime is the commit time in RFC 3339, when known.
	RevisionTime string `json:"revision_time,omitempty"`
	// Modified is true when the work tree had uncommitted changes.
	Modified bool `json:"modified,omitempty"`
	// GoVersion is the toolchain that built the binary.
	GoVersion string `json:"go_version"`
	// Platform is GOOS/GOARCH.
	Platform string `json:"platform"`
}

// Get returns the running binary's build information.
func Get() Info {
	bi, ok := debug.ReadBuildInfo()
	return fromBuildInfo(version, bi, ok)
}

// fromBuildInfo is Get's pure core, separated so it can be tested with
// synthetic build information.
func fromBuildInfo(linkVersion string, bi *debug.BuildInfo, ok bool) Info {
	info := Info{
		Version:   linkVersion,
		GoVersion: runtime.Version(),
		Platform:  runtime.GOOS + "/" + runtime.GOARCH,
	}
	if ok && bi != nil {
		if bi.GoVersion != "" {
			info.GoVersion = bi.GoVersion
		}
		if info.Version == "" {
			info.Version = bi.Main.Version
		}
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				info.Revision = s.Value
			case "vcs.time":
				info.RevisionTime = s.Value
			case "vcs.modified":
				info.Modified = s.Value == "true"
			}
		}
	}
	if info.Version == "" {
		info.Version = develVersion
	}
	return info
}

// String is the one-line form `arbor version` prints, for example
// "arbor v1.2.3 (commit 1a2b3c4d5e6f, go1.26.8, linux/amd64)".
func (i Info) String() string {
	s := "arbor " + i.Version + " ("
	if i.Revision != "" {
		rev := i.Revision
		const shortRevisionChars = 12
		if len(rev) > shortRevisionChars {
			rev = rev[:shortRevisionChars]
		}
		s += "commit " + rev
		if i.Modified {
			s += "+dirty"
		}
		s += ", "
	}
	return s + fmt.Sprintf("%s, %s)", i.GoVersion, i.Platform)
}

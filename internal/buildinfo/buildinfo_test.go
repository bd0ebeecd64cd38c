package buildinfo

import (
	"runtime"
	"runtime/debug"
	"testing"
)

func TestFromBuildInfo(t *testing.T) {
	vcs := &debug.BuildInfo{
		GoVersion: "go1.99.1",
		Main:      debug.Module{Path: "github.com/arbor-storage/arbor", Version: "v0.3.0"},
		Settings: []debug.BuildSetting{
			{Key: "vcs.revision", Value: "0123456789abcdef0123"},
			{Key: "vcs.time", Value: "2026-01-02T03:04:05Z"},
			{Key: "vcs.modified", Value: "true"},
		},
	}
	platform := runtime.GOOS + "/" + runtime.GOARCH
	tests := []struct {
		name        string
		linkVersion string
		bi          *debug.BuildInfo
		ok          bool
		want        Info
		wantString  string
	}{
		{
			name: "link version wins", linkVersion: "v1.2.3", bi: vcs, ok: true,
			want: Info{Version: "v1.2.3", Revision: "0123456789abcdef0123", RevisionTime: "2026-01-02T03:04:05Z",
				Modified: true, GoVersion: "go1.99.1", Platform: platform},
			wantString: "arbor v1.2.3 (commit 0123456789ab+dirty, go1.99.1, " + platform + ")",
		},
		{
			name: "module version without link version", bi: vcs, ok: true,
			want: Info{Version: "v0.3.0", Revision: "0123456789abcdef0123", RevisionTime: "2026-01-02T03:04:05Z",
				Modified: true, GoVersion: "go1.99.1", Platform: platform},
			wantString: "arbor v0.3.0 (commit 0123456789ab+dirty, go1.99.1, " + platform + ")",
		},
		{
			name: "no build info", ok: false,
			want:       Info{Version: develVersion, GoVersion: runtime.Version(), Platform: platform},
			wantString: "arbor (devel) (" + runtime.Version() + ", " + platform + ")",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := fromBuildInfo(tc.linkVersion, tc.bi, tc.ok)
			if got != tc.want {
				t.Fatalf("fromBuildInfo = %+v, want %+v", got, tc.want)
			}
			if s := got.String(); s != tc.wantString {
				t.Fatalf("String = %q, want %q", s, tc.wantString)
			}
		})
	}
}

func TestGetNeverEmpty(t *testing.T) {
	if v := Get().Version; v == "" {
		t.Fatal("Get().Version is empty")
	}
}

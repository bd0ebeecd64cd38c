package devcluster

import (
	"context"
	"fmt"
	"os/exec"
)

// arborPackage is the import path of the arbor command.
const arborPackage = "github.com/arbor-storage/arbor/cmd/arbor"

// BuildBinary builds the arbor command into out with `go build`. It must
// run inside the arbor module (tests do). An up-to-date out is not
// relinked, so calling it again is cheap.
func BuildBinary(ctx context.Context, out string) error {
	goTool, err := exec.LookPath("go")
	if err != nil {
		return fmt.Errorf("devcluster: building arbor needs the go command: %w", err)
	}
	cmd := exec.CommandContext(ctx, goTool, "build", "-o", out, arborPackage)
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("devcluster: go build %s: %w\n%s", arborPackage, err, b)
	}
	return nil
}

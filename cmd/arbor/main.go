// Command arbor is the one binary of the Arbor storage system (DESIGN §3):
// `arbor server` runs a node with any mix of roles, `arbor dev` a whole
// local cluster, and the other commands are the operator's CLI.
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr, os.Getenv))
}

// exitInterrupted is the exit status after a second SIGINT.
const exitInterrupted = 130

// run executes the command line args and returns the exit status.
//
// The first SIGINT or SIGTERM cancels the command's context, which shuts
// it down cleanly. A second SIGINT (an impatient Ctrl-C) exits at once;
// further SIGTERMs are ignored, because the kernel may deliver the
// parent-death signal (SIGTERM, see internal/devcluster) more than once
// when an arbor dev process dies, and that must not cut a clean shutdown
// short.
func run(args []string, stdout, stderr io.Writer, getenv func(string) string) int {
	ctx, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	defer func() {
		signal.Stop(sigs)
		close(sigs)
	}()
	go func() {
		first, ok := <-sigs
		if !ok {
			return
		}
		cancel(fmt.Errorf("%v signal received", first))
		for sig := range sigs {
			if sig == syscall.SIGINT {
				fmt.Fprintln(stderr, "arbor: interrupted again; exiting without a clean shutdown")
				os.Exit(exitInterrupted)
			}
		}
	}()

	a := &app{stdout: stdout, stderr: stderr, getenv: getenv}
	root := newRootCmd(a)
	root.SetArgs(args)
	if err := root.ExecuteContext(ctx); err != nil {
		a.reportError(err)
		return 1
	}
	return 0
}

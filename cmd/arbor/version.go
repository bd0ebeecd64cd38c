package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/arbor-storage/arbor/internal/buildinfo"
)

func newVersionCmd(a *app) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "version",
		Short: "Print the version of this binary",
		Args:  cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			info := buildinfo.Get()
			if asJSON {
				return writeJSON(a.stdout, info)
			}
			_, err := fmt.Fprintln(a.stdout, info.String())
			return err
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

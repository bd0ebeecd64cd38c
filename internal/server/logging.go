package server

import (
	"fmt"
	"io"
	"log/slog"
	"strings"
)

// NewLogger returns the logger a node (or the CLI) writes to w, as text or
// JSON at the configured level.
func NewLogger(w io.Writer, c LogConfig) (*slog.Logger, error) {
	opts := &slog.HandlerOptions{Level: c.Level}
	switch c.Format {
	case "", "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return nil, fmt.Errorf("log format %q must be text or json", c.Format)
}

// ParseLogLevel parses debug, info, warn or error (case-insensitive).
func ParseLogLevel(s string) (slog.Level, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(strings.TrimSpace(s))); err != nil {
		return 0, fmt.Errorf("log level %q must be debug, info, warn or error", s)
	}
	return l, nil
}

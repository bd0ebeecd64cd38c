package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/spf13/pflag"
	"go.yaml.in/yaml/v3"
)

// maxConfigFileBytes bounds a configuration file.
const maxConfigFileBytes = 1 << 20

// applyConfigFile sets flags from a YAML or JSON file whose keys are the
// command's flag names, for example
//
//	node-id: 3
//	data-dir: /var/lib/arbor
//	roles: [directory, storage]
//	directory-peers: 1=10.0.0.1:7080,2=10.0.0.2:7080,3=10.0.0.3:7080
//
// Flags given on the command line win over the file. Lists become
// comma-separated values. An unknown key is an error, so a typo is never
// silently ignored. A bad file fails the command.
func applyConfigFile(flags *pflag.FlagSet, path string) error {
	raw, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("config file: %w", err)
	}
	if len(raw) > maxConfigFileBytes {
		return fmt.Errorf("config file %s: %d bytes, more than the limit of %d", path, len(raw), maxConfigFileBytes)
	}
	values := map[string]any{}
	if strings.EqualFold(filepath.Ext(path), ".json") {
		dec := json.NewDecoder(bytes.NewReader(raw))
		dec.UseNumber()
		err = dec.Decode(&values)
	} else {
		// YAML, which also reads JSON.
		err = yaml.Unmarshal(raw, &values)
	}
	if err != nil {
		return fmt.Errorf("config file %s: %w", path, err)
	}

	keys := make([]string, 0, len(values))
	for k := range values {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	settings := map[string]string{}
	for _, k := range keys {
		f := flags.Lookup(k)
		if f == nil || k == "config" || k == "help" {
			return fmt.Errorf("config file %s: unknown key %q (keys are the command's flag names, such as %s)", path, k, exampleFlags(flags))
		}
		v, err := flagValue(values[k])
		if err != nil {
			return fmt.Errorf("config file %s: %s: %w", path, k, err)
		}
		settings[k] = v
	}
	for _, k := range keys {
		if flags.Lookup(k).Changed {
			continue // the command line wins
		}
		if err := flags.Set(k, settings[k]); err != nil {
			return fmt.Errorf("config file %s: %s: %w", path, k, err)
		}
	}
	return nil
}

// flagValue turns a decoded file value into a flag string.
func flagValue(v any) (string, error) {
	switch v := v.(type) {
	case string:
		return v, nil
	case bool:
		return strconv.FormatBool(v), nil
	case int:
		return strconv.Itoa(v), nil
	case uint64:
		return strconv.FormatUint(v, 10), nil
	case int64:
		return strconv.FormatInt(v, 10), nil
	case float64:
		return strconv.FormatFloat(v, 'g', -1, 64), nil
	case json.Number:
		return v.String(), nil
	case []any:
		parts := make([]string, len(v))
		for i, e := range v {
			s, err := flagValue(e)
			if err != nil {
				return "", err
			}
			if strings.Contains(s, ",") {
				return "", fmt.Errorf("list element %q contains a comma", s)
			}
			parts[i] = s
		}
		return strings.Join(parts, ","), nil
	case nil:
		return "", fmt.Errorf("no value")
	}
	return "", fmt.Errorf("unsupported value %v (%T): use a string, number, boolean or list", v, v)
}

func exampleFlags(flags *pflag.FlagSet) string {
	var names []string
	flags.VisitAll(func(f *pflag.Flag) {
		if len(names) < 4 && f.Name != "config" && f.Name != "help" {
			names = append(names, f.Name)
		}
	})
	return strings.Join(names, ", ")
}

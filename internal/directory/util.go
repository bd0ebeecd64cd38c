package directory

import (
	"cmp"
	"slices"
)

// sortedKeys returns m's keys in order, so that every loop whose outcome
// depends on order is deterministic across replicas.
func sortedKeys[K cmp.Ordered, V any](m map[K]V) []K {
	keys := make([]K, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

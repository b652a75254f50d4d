// Package enum gives the small integer enums of hub, client, relay and the
// Postgres connection their String forms from a table of names, one
// function instead of a switch in every package.
package enum

import "fmt"

// Name returns names[v], or TYPE(v) for a value with no name (out of the
// table, or its entry empty): an unknown value still prints as something a
// reader can trace.
func Name(names []string, v int, typ string) string {
	if v >= 0 && v < len(names) && names[v] != "" {
		return names[v]
	}
	return fmt.Sprintf("%s(%d)", typ, v)
}

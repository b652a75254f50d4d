// Package defaults fills the unset fields of an options struct.
package defaults

// Set sets *v to d when *v is zero or negative: a field left unset, or one
// no caller can mean.
func Set[T ~int | ~int32 | ~int64 | ~float64](v *T, d T) {
	if *v <= 0 {
		*v = d
	}
}

// Package defaults fills the unset fields of an options struct.
package defaults

import "fmt"

// Set sets *v to d when *v is zero or negative: a field left unset, or one
// no caller can mean.
func Set[T ~int | ~int32 | ~int64 | ~float64](v *T, d T) {
	if *v <= 0 {
		*v = d
	}
}

// Or sets *v to d when *v is zero, and refuses a negative *v with an error
// that names field: zero always means the documented default, and a
// negative value is a mistake to say, not to paper over.
func Or[T ~int | ~int32 | ~int64 | ~float64](v *T, d T, field string) error {
	if *v < 0 {
		return fmt.Errorf("%s is negative (%v)", field, any(*v))
	}
	if *v == 0 {
		*v = d
	}
	return nil
}

//go:build !unix

package fdreserve

import "errors"

// Elsewhere the reserve stays empty, and Retry runs f once.
func openNull() (int, error) { return -1, errors.ErrUnsupported }

func closeFD(int) {}

package main

import (
	"fmt"
	"os"
	"strconv"
)

// modeValue is the value of --socket-mode: permission bits in octal.
type modeValue os.FileMode

func (m *modeValue) String() string { return fmt.Sprintf("%04o", uint32(*m)) }
func (m *modeValue) Get() any       { return os.FileMode(*m) }

func (m *modeValue) Set(s string) error {
	v, err := strconv.ParseUint(s, 8, 32)
	if err != nil || v > 0o777 {
		return fmt.Errorf("invalid mode %q: want octal permission bits, e.g. 0660", s)
	}
	*m = modeValue(v)
	return nil
}

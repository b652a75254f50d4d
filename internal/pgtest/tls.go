package pgtest

import (
	"fmt"
	"os"
	"path/filepath"
)

// writeCert writes the certificate and key of Options.TLS into the data
// directory (the key 0600 and owned by the server user: PostgreSQL refuses
// a key others can read), plus a copy of the certificate at the top of the
// cluster directory for clients (CertFile).
func (c *Cluster) writeCert() error {
	certPEM, keyPEM, err := c.opts.TLS()
	if err != nil {
		return err
	}
	files := []struct {
		path string
		data []byte
		mode os.FileMode
	}{
		{filepath.Join(c.dataDir, "server.crt"), certPEM, 0o644},
		{filepath.Join(c.dataDir, "server.key"), keyPEM, 0o600},
		{filepath.Join(c.root, "server.crt"), certPEM, 0o644},
	}
	for _, f := range files {
		if err := os.WriteFile(f.path, f.data, f.mode); err != nil {
			return fmt.Errorf("pgtest: %w", err)
		}
		if err := c.chown(f.path); err != nil {
			return err
		}
	}
	return nil
}

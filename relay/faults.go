package relay

import (
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/listenhub/listenhub/internal/channame"
	"github.com/listenhub/listenhub/internal/relayfix"
)

// Every error that stops a session is one of two classes. A transient one
// (a lost connection, a server restarting or out of connections) is
// retried with backoff. A permanent one (a misconfiguration, a slot that
// can no longer decode, input the server refuses) is a *ConfigError whose
// one line names the fix: Run returns it, or, with Options.RetryConfigErrors, logs it
// and tries again every Options.ConfigRetry.

// permanent returns the ConfigError that err is, or that it becomes when no
// retry can cure it; nil for a transient error.
func permanent(err error) *ConfigError {
	if err == nil {
		return nil
	}
	var ce *ConfigError
	if errors.As(err, &ce) {
		return ce
	}
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		switch {
		case pe.Code == "08P01" && strings.Contains(pe.Message, "unsupported startup parameter"):
			// PgBouncer refusing the relay's synchronous_commit.
			return configErrorf(err, "the server refused a connection parameter (%s): %s", pgLine(pe), relayfix.Pooler)
		case pe.Code == "22021":
			return configErrorf(err, "%s: a channel name is not valid in the server's encoding: change --channel-template", pgLine(pe))
		case pe.Code == "42602":
			return configErrorf(err, "%s: choose a --slot of lower-case letters, digits and underscores", pgLine(pe))
		case strings.HasPrefix(pe.Code, "28"), pe.Code == "3D000", pe.Code == "42501":
			return configErrorf(err, "%s", pgLine(pe))
		}
		return nil
	}
	if strings.Contains(err.Error(), "server refused TLS connection") {
		return configErrorf(err, "%s: the server does not accept TLS: turn it on in PostgreSQL (ssl = on) or change sslmode in the database URL", oneLine(err))
	}
	return nil
}

// pgLine is a server error in one line with its detail and hint.
func pgLine(pe *pgconn.PgError) string {
	s := pe.Message + " (" + pe.Code + ")"
	if pe.Detail != "" {
		s += "; detail: " + pe.Detail
	}
	if pe.Hint != "" {
		s += "; hint: " + pe.Hint
	}
	return oneLine(errors.New(s))
}

// errLine is an error in one line, with the server's detail and hint when
// it carries a server error.
func errLine(err error) string {
	s := oneLine(err)
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		if pe.Detail != "" && !strings.Contains(s, pe.Detail) {
			s += "; detail: " + oneLine(errors.New(pe.Detail))
		}
		if pe.Hint != "" && !strings.Contains(s, pe.Hint) {
			s += "; hint: " + oneLine(errors.New(pe.Hint))
		}
	}
	return s
}

// checkSlotName applies PostgreSQL's rule for replication slot names, which
// the server would otherwise refuse at every attempt.
func checkSlotName(name string) error {
	if len(name) > channame.MaxLen {
		return fmt.Errorf("slot name %q is %d bytes, over the %d PostgreSQL allows", name, len(name), channame.MaxLen)
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_') {
			return fmt.Errorf("slot name %q: PostgreSQL allows only lower-case letters, digits and underscores (e.g. --slot %s)", name, suggestSlot(name))
		}
	}
	return nil
}

func suggestSlot(name string) string {
	b := []byte(strings.ToLower(name))
	for i, c := range b {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_') {
			b[i] = '_'
		}
	}
	return string(b)
}

// checkTemplateBytes refuses a template that no server could take as a
// channel name: a byte that is not UTF-8 (the connection's encoding), or a
// NUL.
func checkTemplateBytes(t string) error {
	if !utf8.ValidString(t) {
		return fmt.Errorf("channel template %q has a byte that is not UTF-8: every NOTIFY would fail (22021)", t)
	}
	if strings.IndexByte(t, 0) >= 0 {
		return fmt.Errorf("channel template %q has a NUL byte", t)
	}
	return nil
}

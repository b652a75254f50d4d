package fleet_test

import (
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/listenhub/listenhub/fleet"
)

// Every channel name maps to one valid subject token and back; a token
// EncodeToken cannot write is refused; two databases never share a subject.
func TestSubjectsRoundTrip(t *testing.T) {
	a, err := fleet.NewSubjects("", "app")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := fleet.NewSubjects("", "app.x")
	c, _ := fleet.NewSubjects("acme.prod", "app")
	r := rand.New(rand.NewPCG(1, 2))
	names := []string{"orders", "pgmq.q_jobs.INSERT", "a b", "*", ">", "~41", "Mixed\"Case.q", "café", "x.y.z"}
	for range 2000 {
		n := make([]byte, 1+r.IntN(63))
		for i := range n {
			n[i] = byte(1 + r.IntN(255))
		}
		names = append(names, string(n))
	}
	for _, name := range names {
		subj := a.Notify(name)
		tok := strings.TrimPrefix(subj, "listenhub.app.n.")
		if strings.ContainsAny(tok, ". *>\t\r\n") || tok == "" {
			t.Fatalf("%q: token %q is not one NATS token", name, tok)
		}
		if got, ok := a.Channel(subj); !ok || got != name {
			t.Fatalf("%q: back as %q, %v", name, got, ok)
		}
		if _, ok := b.Channel(subj); ok {
			t.Fatalf("%q: database app.x reads database app's subject %q", name, subj)
		}
		if _, ok := c.Channel(subj); ok {
			t.Fatalf("%q: prefix acme.prod reads prefix listenhub's subject %q", name, subj)
		}
	}
	for _, bad := range []string{"listenhub.app.n.~4", "listenhub.app.n.~41", "listenhub.app.n.a.b", "listenhub.app.n.", "listenhub.app.n.~zz", "listenhub.app.hb"} {
		if ch, ok := a.Channel(bad); ok {
			t.Fatalf("%q read as channel %q", bad, ch)
		}
	}
	for _, bad := range []string{"a..b", "a.*", "a b", "."} {
		if _, err := fleet.NewSubjects(bad, "app"); err == nil {
			t.Fatalf("prefix %q accepted", bad)
		}
	}
}

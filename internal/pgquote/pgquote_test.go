package pgquote

import "testing"

func TestIdent(t *testing.T) {
	for in, want := range map[string]string{
		"orders":       `"orders"`,
		`a"b`:          `"a""b"`,
		`"; DROP x; "`: `"""; DROP x; """`,
		"":             `""`,
	} {
		if got := Ident(in); got != want {
			t.Errorf("Ident(%q) = %s, want %s", in, got, want)
		}
	}
}

func TestLiteral(t *testing.T) {
	for in, want := range map[string]string{
		"x":       `'x'`,
		"it's":    `'it''s'`,
		`back\'s`: `'back\''s'`,
		"":        `''`,
	} {
		if got := Literal(in); got != want {
			t.Errorf("Literal(%q) = %s, want %s", in, got, want)
		}
	}
}

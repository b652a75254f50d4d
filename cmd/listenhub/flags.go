package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// envPrefix: every flag --some-name can also be set with LISTENHUB_SOME_NAME.
// The command line wins over the environment.
const envPrefix = "LISTENHUB_"

func envName(flagName string) string {
	return envPrefix + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// newFlagSet returns a flag set that reports errors only through Parse's
// return value, so that a bad flag prints one line, ours.
func newFlagSet(name string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	return fs
}

// parseFlags parses args, then fills every flag not given on the command
// line from its environment variable. It returns flag.ErrHelp for -h.
func parseFlags(fs *flag.FlagSet, args []string) error {
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	var err error
	fs.VisitAll(func(f *flag.Flag) {
		if err != nil || given[f.Name] {
			return
		}
		env := envName(f.Name)
		v := os.Getenv(env)
		if v == "" {
			return
		}
		if e := fs.Set(f.Name, v); e != nil {
			err = fmt.Errorf("invalid value %q for %s: %w", v, env, e)
		}
	})
	return err
}

// isSet reports whether the flag was given on the command line or through
// its environment variable.
func isSet(fs *flag.FlagSet, name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}

// printUsage writes the command's synopsis and flags; fromEnv says
// whether the command reads its flags from the environment too
// (parseFlags).
func printUsage(w io.Writer, fs *flag.FlagSet, cmd string, fromEnv bool) {
	fmt.Fprintf(w, "usage: listenhub %s\n\n", synopsis(cmd))
	if fromEnv {
		// The example is the flag most often set that way.
		var example string
		for _, name := range []string{"socket", "metrics-addr", "database-url"} {
			if fs.Lookup(name) != nil {
				example = name
				break
			}
		}
		fs.VisitAll(func(f *flag.Flag) {
			if example == "" {
				example = f.Name
			}
		})
		fmt.Fprintf(w, "flags (each also read from %s<NAME>, e.g. %s):\n", envPrefix, envName(example))
	} else {
		fmt.Fprint(w, "flags:\n")
	}
	printDefaults(w, fs)
}

// printDefaults is flag.PrintDefaults with the --name spelling the
// documentation uses (the flag package accepts both).
func printDefaults(w io.Writer, fs *flag.FlagSet) {
	fs.VisitAll(func(f *flag.Flag) {
		name, usage := flag.UnquoteUsage(f)
		switch f.Value.(type) {
		case *durationValue:
			name = "duration"
		case *uidList:
			name = "uids"
		}
		line := "  --" + f.Name
		if name != "" {
			line += " " + name
		}
		line += "\n    \t" + strings.ReplaceAll(usage, "\n", "\n    \t")
		if !isZeroDefault(f.DefValue) {
			if isStringFlag(f) {
				line += fmt.Sprintf(" (default %q)", f.DefValue)
			} else {
				line += fmt.Sprintf(" (default %v)", f.DefValue)
			}
		}
		fmt.Fprintln(w, line)
	})
}

func isZeroDefault(v string) bool {
	switch v {
	case "", "0", "false", "0s":
		return true
	}
	return false
}

func isStringFlag(f *flag.Flag) bool {
	g, ok := f.Value.(flag.Getter)
	if !ok {
		return false
	}
	_, ok = g.Get().(string)
	return ok
}

// flagError turns a Parse error into the one line a bad flag prints, with
// flags spelled --name as the documentation does.
func flagError(stderr io.Writer, cmd string, err error) int {
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	msg := dashes.ReplaceAllString(err.Error(), "$1 --$2")
	fmt.Fprintf(stderr, "listenhub %s: %s (see listenhub %s -h)\n", cmd, msg, cmd)
	return 2
}

// dashes finds the flag package's "-name" in its error messages.
var dashes = regexp.MustCompile(`(not defined:|needs an argument:|for flag|for) -([a-zA-Z])`)

// durationValue is a time.Duration flag whose error says what a duration
// looks like: "5" is the likeliest mistake, and the flag package's own
// message for it is "parse error".
type durationValue time.Duration

func durationFlag(fs *flag.FlagSet, name string, def time.Duration, usage string) *time.Duration {
	p := new(time.Duration)
	*p = def
	fs.Var((*durationValue)(p), name, usage)
	return p
}

func (d *durationValue) Set(s string) error {
	v, err := time.ParseDuration(s)
	if err != nil {
		return fmt.Errorf("invalid duration %q: use a unit, e.g. 5s or 500ms", s)
	}
	*d = durationValue(v)
	return nil
}

func (d *durationValue) String() string { return time.Duration(*d).String() }
func (d *durationValue) Get() any       { return time.Duration(*d) }

// uidList is the value of --allow-uid: comma-separated uids, repeatable.
type uidList []int

func (u *uidList) String() string {
	s := make([]string, len(*u))
	for i, v := range *u {
		s[i] = strconv.Itoa(v)
	}
	return strings.Join(s, ",")
}

func (u *uidList) Set(v string) error {
	for _, f := range strings.Split(v, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		n, err := strconv.ParseUint(f, 10, 32)
		if err != nil {
			return fmt.Errorf("not a uid: %q", f)
		}
		*u = append(*u, int(n))
	}
	return nil
}

// positiveInt and positiveDuration reject the values that would mean
// "default" or nonsense to the hub: a limit of 0 or an interval of 0.
func positiveInt(name string, v int) error {
	if v < 1 {
		return fmt.Errorf("--%s must be at least 1 (got %d)", name, v)
	}
	return nil
}

func nonNegativeInt(name string, v int) error {
	if v < 0 {
		return fmt.Errorf("--%s must not be negative (got %d)", name, v)
	}
	return nil
}

func positiveDuration(name string, v time.Duration) error {
	if v <= 0 {
		return fmt.Errorf("--%s must be positive (got %v)", name, v)
	}
	return nil
}

// newLogger builds the slog logger of --log-format and --log-level.
func newLogger(w io.Writer, format, level string) (*slog.Logger, error) {
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("--log-level %q: want debug, info, warn or error", level)
	}
	opts := &slog.HandlerOptions{Level: lv}
	switch format {
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	case "json":
		// slog's JSON gives a time.Duration as integer nanoseconds
		// ("retry_in_max":5000000000): unreadable, and wrong by 10^9
		// to anyone who assumes seconds. The text format's "5s" it is.
		opts.ReplaceAttr = func(_ []string, a slog.Attr) slog.Attr {
			if a.Value.Kind() == slog.KindDuration {
				a.Value = slog.StringValue(a.Value.Duration().String())
			}
			return a
		}
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return nil, fmt.Errorf("--log-format %q: want text or json", format)
}

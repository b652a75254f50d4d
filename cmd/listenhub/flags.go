package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
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
			err = fmt.Errorf("invalid value %q for %s: %v", v, env, e)
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

// printUsage writes the command's synopsis and flags.
func printUsage(w io.Writer, fs *flag.FlagSet, synopsis string) {
	fmt.Fprintf(w, "usage: listenhub %s\n\nflags (each also read from %s<NAME>, e.g. %s):\n", synopsis, envPrefix, envName("socket"))
	fs.SetOutput(w)
	fs.PrintDefaults()
	fs.SetOutput(io.Discard)
}

// flagError turns a Parse error into the one line a bad flag prints.
func flagError(stderr io.Writer, cmd string, err error) int {
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	fmt.Fprintf(stderr, "listenhub %s: %v (see listenhub %s -h)\n", cmd, err, cmd)
	return 2
}

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
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return nil, fmt.Errorf("--log-format %q: want text or json", format)
}

package main

import (
	"bufio"
	"bytes"
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/listenhub/listenhub/hub"
)

// A --config file holds serve's settings, one `key = value` per line, the
// keys being the flag names (max-workers, or max_workers as pgbouncer.ini
// spells them), with blank lines and whole-line comments (# or ;). Values
// are taken as they stand after the "=" (spaces trimmed, no quoting: a #
// inside a value, in a password say, is part of it). A flag given on the
// command line or in the environment overrides the file.

// configEntry is one setting of a config file.
type configEntry struct {
	key, value string
	line       int
}

// readConfigFile parses path. Errors name the file and line.
func readConfigFile(path string) ([]configEntry, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("--config: %w", err)
	}
	var out []configEntry
	seen := map[string]int{}
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(nil, 1<<20)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' || line[0] == ';' {
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if !ok {
			return nil, fmt.Errorf("%s:%d: want key = value, got %q", path, n, line)
		}
		k = strings.ReplaceAll(strings.TrimSpace(k), "_", "-")
		if k == "" {
			return nil, fmt.Errorf("%s:%d: no key before the =", path, n)
		}
		if first, dup := seen[k]; dup {
			return nil, fmt.Errorf("%s:%d: %s is set twice (first on line %d)", path, n, k, first)
		}
		seen[k] = n
		out = append(out, configEntry{key: k, value: strings.TrimSpace(v), line: n})
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return out, nil
}

// checkConfigKeys fails on a key fs has no flag for, or one a file cannot
// set.
func checkConfigKeys(fs *flag.FlagSet, path string, entries []configEntry) error {
	for _, e := range entries {
		if e.key == "config" {
			return fmt.Errorf("%s:%d: a config file cannot name another (config)", path, e.line)
		}
		if fs.Lookup(e.key) == nil {
			return fmt.Errorf("%s:%d: unknown key %q (keys are serve's flag names, see serve -h)", path, e.line, e.key)
		}
	}
	return nil
}

// applyConfig sets every flag of fs named in entries that the command line
// and the environment did not set (fromArgs).
func applyConfig(fs *flag.FlagSet, path string, entries []configEntry, fromArgs map[string]bool) error {
	if err := checkConfigKeys(fs, path, entries); err != nil {
		return err
	}
	for _, e := range entries {
		if fromArgs[e.key] {
			continue
		}
		if err := fs.Set(e.key, e.value); err != nil {
			return fmt.Errorf("%s:%d: %s: invalid value %q: %w", path, e.line, e.key, e.value, err)
		}
	}
	return nil
}

// loadConfig reads the --config file, if any, into the flags the command
// line and the environment left unset. It returns which flags those set
// (the file cannot change them, now or on SIGHUP) and the file's entries.
func loadConfig(fs *flag.FlagSet, path string) (fromArgs map[string]bool, entries []configEntry, err error) {
	fromArgs = visited(fs)
	if path == "" {
		return fromArgs, nil, nil
	}
	if entries, err = readConfigFile(path); err != nil {
		return nil, nil, err
	}
	return fromArgs, entries, applyConfig(fs, path, entries, fromArgs)
}

// logOverridden logs, once at start, each setting of the config file that
// the command line or the environment overrode, with where the value in
// force came from: a key in the file that does nothing is otherwise
// invisible (say a unit's ExecStart= flag shadowing the file). Values of
// database-url are not logged (a password).
func logOverridden(log *slog.Logger, path string, entries []configEntry, fromArgs map[string]bool, fs *flag.FlagSet, args []string) {
	for _, e := range entries {
		if !fromArgs[e.key] {
			continue
		}
		by := envName(e.key)
		if onCommandLine(args, e.key) {
			by = "--" + e.key
		}
		attrs := []any{"key", e.key, "file", fmt.Sprintf("%s:%d", path, e.line), "by", by}
		if e.key != "database-url" {
			attrs = append(attrs, "file_value", e.value, "in_force", fs.Lookup(e.key).Value.String())
		}
		log.Warn("config: a setting of the file is overridden", attrs...)
	}
}

// onCommandLine reports whether args give flag name (-name, --name, with
// or without =value) before any "--".
func onCommandLine(args []string, name string) bool {
	for _, a := range args {
		if a == "--" {
			return false
		}
		if !strings.HasPrefix(a, "-") {
			continue // a value, or no flag at all
		}
		a = strings.TrimPrefix(strings.TrimPrefix(a, "-"), "-")
		if k, _, _ := strings.Cut(a, "="); k == name {
			return true
		}
	}
	return false
}

// visited returns the names of the flags set so far.
func visited(fs *flag.FlagSet) map[string]bool {
	m := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { m[f.Name] = true })
	return m
}

// liveKeys are the settings SIGHUP applies to the running hub; any other
// change in the file waits for an upgrade (SIGUSR2), whose new process
// reads the file afresh.
var liveKeys = []string{"log-level", "log-format", "max-workers", "max-subscriptions", "max-channels",
	"hard-queue-limit", "hard-queue-bytes", "durable-queue-limit", "max-outbound-bytes", "frame-timeout",
	"stall-timeout", "status-interval", "allow-uid"}

// restartKeys are the settings an upgrade refuses to change: the channel
// mapping, which the workers handed over are subscribed under.
var restartKeys = []string{"channel-prefix", "channel-suffix"}

// intOf and durationOf read fs's int and duration flags by name.
func intOf(fs *flag.FlagSet) func(string) int {
	return func(k string) int { return fs.Lookup(k).Value.(flag.Getter).Get().(int) }
}

func durationOf(fs *flag.FlagSet) func(string) time.Duration {
	return func(k string) time.Duration { return fs.Lookup(k).Value.(flag.Getter).Get().(time.Duration) }
}

// checkLiveFlags checks the numeric settings of liveKeys: at start, and
// before SIGHUP applies them.
func checkLiveFlags(fs *flag.FlagSet) error {
	num, dur := intOf(fs), durationOf(fs)
	for _, err := range []error{
		positiveInt("durable-queue-limit", num("durable-queue-limit")),
		positiveInt("hard-queue-limit", num("hard-queue-limit")),
		positiveInt("hard-queue-bytes", num("hard-queue-bytes")),
		nonNegativeInt("max-outbound-bytes", num("max-outbound-bytes")),
		positiveInt("max-workers", num("max-workers")),
		positiveInt("max-subscriptions", num("max-subscriptions")),
		positiveInt("max-channels", num("max-channels")),
		positiveDuration("frame-timeout", dur("frame-timeout")),
		positiveDuration("stall-timeout", dur("stall-timeout")),
		positiveDuration("status-interval", dur("status-interval")),
	} {
		if err != nil {
			return err
		}
	}
	return nil
}

// configReloader re-reads the --config file on SIGHUP.
type configReloader struct {
	fs       *flag.FlagSet
	path     string
	fromArgs map[string]bool   // set on the command line or in the environment: the file cannot change them
	applied  map[string]string // what the file set, as written
	logs     *logSwitch
	log      *slog.Logger
	h        *hub.Hub
}

func newConfigReloader(fs *flag.FlagSet, path string, fromArgs map[string]bool, entries []configEntry) *configReloader {
	r := &configReloader{fs: fs, path: path, fromArgs: fromArgs, applied: map[string]string{}}
	for _, e := range entries {
		if !fromArgs[e.key] {
			r.applied[e.key] = e.value
		}
	}
	return r
}

// reload re-reads the file and applies what changed in the live settings;
// the other changes are logged as waiting for an upgrade. A file that does
// not parse, or a value that is invalid, changes nothing.
func (r *configReloader) reload(ctx context.Context) {
	if r.path == "" {
		r.log.Warn("SIGHUP ignored; send SIGUSR2 to upgrade, SIGTERM to stop (no --config file to re-read)")
		return
	}
	entries, err := readConfigFile(r.path)
	if err == nil {
		err = checkConfigKeys(r.fs, r.path, entries)
	}
	if err != nil {
		r.log.Error("config not reloaded", "reason", err)
		return
	}
	want := map[string]string{}
	line := map[string]int{}
	var live, upgrade, restart, overridden []string
	for _, e := range entries {
		if r.fromArgs[e.key] {
			overridden = append(overridden, e.key)
		} else {
			want[e.key], line[e.key] = e.value, e.line
		}
	}
	for _, k := range union(want, r.applied) {
		v, inFile := want[k]
		if !inFile {
			v = r.fs.Lookup(k).DefValue // taken out of the file: back to the default
		}
		if old, was := r.applied[k]; was && old == v || !was && v == r.fs.Lookup(k).Value.String() {
			continue
		}
		switch {
		case slices.Contains(liveKeys, k):
			live = append(live, k)
		case slices.Contains(restartKeys, k):
			restart = append(restart, k)
		default:
			upgrade = append(upgrade, k)
		}
	}
	if len(live) > 0 {
		if err := r.applyLive(ctx, live, want, line); err != nil {
			r.log.Error("config not reloaded", "reason", err)
			return
		}
	}
	if len(overridden) > 0 {
		r.log.Info("config: settings given as flags or in the environment override the file", "keys", overridden)
	}
	for _, k := range live {
		if v, ok := want[k]; ok {
			r.applied[k] = v
		} else {
			delete(r.applied, k)
		}
	}
	if len(upgrade) > 0 {
		r.log.Warn("config: changed settings need an upgrade (SIGUSR2) to take effect", "keys", upgrade)
	}
	if len(restart) > 0 {
		r.log.Warn("config: a changed channel mapping needs a restart; an upgrade refuses it (its workers' channels are named under the old one)", "keys", restart)
	}
	r.log.Info("config reloaded", "file", r.path, "applied", live)
}

// union returns the keys of a and b, sorted.
func union(a, b map[string]string) []string {
	var ks []string
	for k := range a {
		ks = append(ks, k)
	}
	for k := range b {
		if _, ok := a[k]; !ok {
			ks = append(ks, k)
		}
	}
	slices.Sort(ks)
	return ks
}

// applyLive sets the live flags in keys to their new values and hands them
// to the hub and the logger; on any error every flag is set back.
func (r *configReloader) applyLive(ctx context.Context, keys []string, want map[string]string, line map[string]int) (err error) {
	oldFormat, oldLevel := r.fs.Lookup("log-format").Value.String(), r.fs.Lookup("log-level").Value.String()
	old := map[string]string{}
	for _, k := range keys {
		old[k] = r.fs.Lookup(k).Value.String()
	}
	defer func() {
		if err != nil {
			for k, v := range old {
				r.set(k, v)
			}
		}
	}()
	for _, k := range keys {
		v, ok := want[k]
		if !ok {
			v = r.fs.Lookup(k).DefValue
		}
		if err := r.set(k, v); err != nil {
			return fmt.Errorf("%s:%d: %s: invalid value %q: %w", r.path, line[k], k, v, err)
		}
	}
	if err := checkLiveFlags(r.fs); err != nil {
		return err
	}
	num, dur := intOf(r.fs), durationOf(r.fs)
	// The log first, so that what follows is written as asked.
	if err := r.logs.set(r.fs.Lookup("log-format").Value.String(), r.fs.Lookup("log-level").Value.String()); err != nil {
		return err
	}
	defer func() {
		if err != nil {
			r.logs.set(oldFormat, oldLevel)
		}
	}()
	return r.h.SetLive(ctx, hub.Live{
		DurableQueueLimit: num("durable-queue-limit"),
		HardQueueLimit:    num("hard-queue-limit"),
		HardQueueBytes:    num("hard-queue-bytes"),
		MaxOutboundBytes:  num("max-outbound-bytes"),
		MaxWorkers:        num("max-workers"),
		MaxSubscriptions:  num("max-subscriptions"),
		MaxChannels:       num("max-channels"),
		FrameTimeout:      dur("frame-timeout"),
		StallTimeout:      dur("stall-timeout"),
		StatusInterval:    dur("status-interval"),
		AllowUIDs:         *r.fs.Lookup("allow-uid").Value.(*uidList),
	})
}

// set sets flag k to v, from scratch for a list (a uidList appends).
func (r *configReloader) set(k, v string) error {
	f := r.fs.Lookup(k)
	if u, ok := f.Value.(*uidList); ok {
		*u = nil
	}
	return f.Value.Set(v)
}

// logSwitch is the serve logger's handler: its level and format can change
// while every logger made from it (the hub's, the relay's) keeps working.
type logSwitch struct {
	w     io.Writer
	level slog.LevelVar
	cur   atomic.Pointer[slog.Handler]
}

func newLogSwitch(w io.Writer, format, level string) (*logSwitch, error) {
	s := &logSwitch{w: w}
	if err := s.set(format, level); err != nil {
		return nil, err
	}
	return s, nil
}

// set switches to format and level, checked as newLogger checks them.
func (s *logSwitch) set(format, level string) error {
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(level)); err != nil {
		return fmt.Errorf("--log-level %q: want debug, info, warn or error", level)
	}
	opts := &slog.HandlerOptions{Level: &s.level}
	var h slog.Handler
	switch format {
	case "text":
		h = slog.NewTextHandler(s.w, opts)
	case "json":
		h = slog.NewJSONHandler(s.w, opts)
	default:
		return fmt.Errorf("--log-format %q: want text or json", format)
	}
	s.level.Set(lv)
	s.cur.Store(&h)
	return nil
}

func (s *logSwitch) Enabled(_ context.Context, l slog.Level) bool { return l >= s.level.Level() }
func (s *logSwitch) Handle(ctx context.Context, r slog.Record) error {
	return (*s.cur.Load()).Handle(ctx, r)
}
func (s *logSwitch) WithAttrs(as []slog.Attr) slog.Handler {
	return &derivedLog{s: s, ops: []func(slog.Handler) slog.Handler{func(h slog.Handler) slog.Handler { return h.WithAttrs(as) }}}
}
func (s *logSwitch) WithGroup(name string) slog.Handler {
	return &derivedLog{s: s, ops: []func(slog.Handler) slog.Handler{func(h slog.Handler) slog.Handler { return h.WithGroup(name) }}}
}

// derivedLog is a logSwitch with attributes or groups added: they are
// applied to the handler in force, once each time it changes (not at every
// record: a JSON handler's WithAttrs formats them).
type derivedLog struct {
	s     *logSwitch
	ops   []func(slog.Handler) slog.Handler
	cache atomic.Pointer[derivedHandler]
}

// derivedHandler is ops applied to the logSwitch handler base.
type derivedHandler struct {
	base *slog.Handler
	h    slog.Handler
}

func (d *derivedLog) Enabled(ctx context.Context, l slog.Level) bool { return d.s.Enabled(ctx, l) }
func (d *derivedLog) Handle(ctx context.Context, r slog.Record) error {
	base := d.s.cur.Load()
	if c := d.cache.Load(); c != nil && c.base == base {
		return c.h.Handle(ctx, r)
	}
	h := *base
	for _, op := range d.ops {
		h = op(h)
	}
	d.cache.Store(&derivedHandler{base: base, h: h})
	return h.Handle(ctx, r)
}
func (d *derivedLog) WithAttrs(as []slog.Attr) slog.Handler {
	return &derivedLog{s: d.s, ops: append(slices.Clip(d.ops), func(h slog.Handler) slog.Handler { return h.WithAttrs(as) })}
}
func (d *derivedLog) WithGroup(name string) slog.Handler {
	return &derivedLog{s: d.s, ops: append(slices.Clip(d.ops), func(h slog.Handler) slog.Handler { return h.WithGroup(name) })}
}

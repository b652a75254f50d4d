package main

// The churn process: `lhbench churn --socket PATH --cycles N --channel Q`.
//
// Each cycle connects to the hub and ends the connection one of four ways,
// in a fixed rotation, so that every run exercises the same mix:
//
//	4/10 clean:     sub, read until ack, close
//	3/10 unread:    sub, close at once (status, ack and wakes left unread,
//	                or written by the hub into a closed socket)
//	2/10 mid-frame: write 7 bytes of a sub frame, close
//	1/10 unsub:     sub, read until ack, unsub, close
//
// With --rounds R it does the cycles in R equal rounds; after each it prints
// {"cycles":N,"errors":E,"seconds":S} (cumulative) and, except after the
// last, waits for a line on stdin before the next round, so that the
// harness can read the hub's RSS between rounds without process start-up
// gaps in the churn.

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/listenhub/listenhub/benchmarks/internal/wire"
)

func churnMain(args []string) error {
	fs := flag.NewFlagSet("churn", flag.ExitOnError)
	socket := fs.String("socket", "", "hub socket path")
	cycles := fs.Int("cycles", 10000, "connect/subscribe/close cycles")
	channel := fs.String("channel", "churn", "subscription name")
	offset := fs.Int("offset", 0, "rotation offset (so processes interleave kinds)")
	rounds := fs.Int("rounds", 1, "report and wait for a stdin line after each of this many rounds")
	rate := fs.Float64("rate", 0, "cycles per second (0: as fast as possible)")
	fs.Parse(args)
	in := bufio.NewScanner(os.Stdin)
	out := json.NewEncoder(os.Stdout)

	sub := wire.AppendSub(nil, *channel)
	unsub := wire.AppendUnsub(nil, *channel)
	var errs int
	var firstErr string
	var busy time.Duration
	per := *cycles / *rounds
	for r := range *rounds {
		start := time.Now()
		for i := range per {
			if *rate > 0 {
				if d := time.Until(start.Add(time.Duration(float64(i) / *rate * float64(time.Second)))); d > 0 {
					time.Sleep(d)
				}
			}
			err := churnOnce((r*per+i+*offset)%10, *socket, sub, unsub)
			if err != nil {
				errs++
				if firstErr == "" {
					firstErr = err.Error()
				}
			}
		}
		busy += time.Since(start)
		out.Encode(map[string]any{
			"cycles": per * (r + 1), "errors": errs, "first_error": firstErr,
			"seconds": busy.Seconds(),
		})
		if r < *rounds-1 && !in.Scan() {
			return nil
		}
	}
	return nil
}

func churnOnce(kind int, socket string, sub, unsub []byte) error {
	c, err := dialUnix(socket, 10*time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	switch {
	case kind < 4 || kind == 9:
		if _, err := c.Write(sub); err != nil {
			return err
		}
		c.SetReadDeadline(time.Now().Add(10 * time.Second))
		r := wire.NewReader(c, 4096)
		for {
			body, err := r.Next()
			if err != nil {
				return fmt.Errorf("waiting for ack: %w", err)
			}
			if _, _, ok := wire.FastWake(body); ok {
				continue
			}
			m, err := wire.Decode(body)
			if err != nil {
				return err
			}
			if m.T == "ack" {
				break
			}
			if m.T == "nack" {
				return fmt.Errorf("nack: %s", m.Error)
			}
		}
		if kind == 9 {
			_, err = c.Write(unsub)
		}
		return err
	case kind < 7:
		_, err = c.Write(sub)
		return err
	default:
		_, err = c.Write(sub[:7])
		return err
	}
}

package main

import (
	"fmt"
	"strings"
)

// guardPaced is --guard: CI's check that the hub's epoll path did not get
// slower. For every paced row of the hub at N ≥ 64 (below that a few
// hundred microseconds of CPU decide the ratio), the hub's server CPU per
// delivery must stay within ratio × gohub's, measured in the same run over
// interleaved rounds, and the hub must have lost nothing. The bound is a
// ratio against a baseline of the same run, never an absolute figure: the
// machines are shared and noisy. It says which rows failed, or nil.
func guardPaced(res *Results, ratio float64) error {
	perDelivery := func(r LatencyRow) float64 {
		if r.Recv == 0 {
			return 0
		}
		return r.CPU * 1e6 / float64(r.Recv)
	}
	var bad []string
	checked := 0
	for _, h := range res.Paced {
		if h.System != "hub" || h.N < 64 {
			continue
		}
		if h.Err != "" || h.Lost > 0 || h.Evicted > 0 {
			bad = append(bad, fmt.Sprintf("hub paced N=%d (%s): error %q, %d lost, %d evicted", h.N, h.Layout, h.Err, h.Lost, h.Evicted))
			continue
		}
		for _, g := range res.Paced {
			if g.System != "gohub" || g.N != h.N || g.Layout != h.Layout || g.Err != "" {
				continue
			}
			hc, gc := perDelivery(h), perDelivery(g)
			if hc == 0 || gc == 0 {
				bad = append(bad, fmt.Sprintf("paced N=%d (%s): no CPU figure (hub %.1f µs, gohub %.1f µs)", h.N, h.Layout, hc, gc))
				continue
			}
			checked++
			if hc > ratio*gc {
				bad = append(bad, fmt.Sprintf("paced N=%d (%s): hub %.1f µs CPU/delivery is %.2f× gohub's %.1f µs, over the guard's %.2f×", h.N, h.Layout, hc, hc/gc, gc, ratio))
			}
		}
	}
	if len(bad) > 0 {
		return fmt.Errorf("guard: %s", strings.Join(bad, "; "))
	}
	if checked == 0 {
		return fmt.Errorf("guard: no paced row of both hub and gohub at N ≥ 64 to compare (run with --only paced --systems hub,gohub --n 256)")
	}
	return nil
}

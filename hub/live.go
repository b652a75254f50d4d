package hub

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"
)

// Live is the part of a Config a running hub can change (SetLive): caps,
// timeouts, the status interval and who may connect. A zero field means
// the default, as in Config.
type Live struct {
	DurableQueueLimit int
	HardQueueLimit    int
	HardQueueBytes    int
	MaxOutboundBytes  int
	MaxWorkers        int
	MaxSubscriptions  int
	MaxChannels       int
	FrameTimeout      time.Duration
	StallTimeout      time.Duration
	StatusInterval    time.Duration
	AllowUIDs         []int
}

// SetLive applies l to the running hub, on its loop, and returns once it is
// in force (or ctx is done first, or the hub stopped). Values are checked as
// New checks them; an invalid one changes nothing. What is already there
// keeps what it has: connected workers stay whatever AllowUIDs now says
// (only new connections are checked), and a worker or channel over a
// lowered cap is not cut (only new subs are refused). A lowered hard limit
// applies from the next frame queued; a budget lowered below what the hub
// holds is enforced at the end of the iteration, as always: the workers
// holding the most are evicted until the rest fits. Config, from any
// goroutine, returns the new values once SetLive has returned.
func (h *Hub) SetLive(ctx context.Context, l Live) error {
	if !h.started.Load() || h.loop == nil {
		return errors.New("hub: SetLive before Start")
	}
	res := make(chan error, 1)
	if err := h.loop.Post(func() { res <- h.setLive(l) }); err != nil {
		return fmt.Errorf("hub: SetLive: %w", err)
	}
	select {
	case err := <-res:
		return err
	case <-h.done:
		return errors.New("hub: SetLive: the hub stopped")
	case <-ctx.Done():
		return ctx.Err()
	}
}

// setLive is SetLive on the loop.
func (h *Hub) setLive(l Live) error {
	c := h.cfg
	c.DurableQueueLimit, c.HardQueueLimit, c.HardQueueBytes = l.DurableQueueLimit, l.HardQueueLimit, l.HardQueueBytes
	c.MaxOutboundBytes, c.MaxWorkers, c.MaxSubscriptions, c.MaxChannels = l.MaxOutboundBytes, l.MaxWorkers, l.MaxSubscriptions, l.MaxChannels
	c.FrameTimeout, c.StallTimeout, c.StatusInterval, c.AllowUIDs = l.FrameTimeout, l.StallTimeout, l.StatusInterval, slices.Clone(l.AllowUIDs)
	c, err := c.withDefaults()
	if err != nil {
		return err
	}
	old := h.cfg
	h.cfg = c
	h.publishConfig()
	if c.MaxWorkers != old.MaxWorkers {
		h.fds.maxWorkers = min(c.MaxWorkers, h.fds.fdWorkers)
	}
	if bufferMaxOf(&c) != bufferMaxOf(&old) {
		for _, w := range h.workers.list {
			w.out.Max = h.bufferMax() // never drops what is queued
		}
	}
	if c.StatusInterval != old.StatusInterval && h.status.timer != nil && !h.stopping && (h.up == nil || !h.up.handed) {
		h.status.timer.Stop()
		h.status.timer = h.clk.Every(c.StatusInterval, h.onStatusTick)
	}
	clear(h.allow)
	for _, uid := range c.AllowUIDs {
		h.allow[uint32(uid)] = struct{}{}
	}
	h.log.Info("settings changed", "max_workers", h.fds.maxWorkers, "max_subscriptions", c.MaxSubscriptions,
		"max_channels", c.MaxChannels, "hard_queue_limit", c.HardQueueLimit, "hard_queue_bytes", c.HardQueueBytes,
		"durable_queue_limit", c.DurableQueueLimit, "max_outbound_bytes", c.MaxOutboundBytes,
		"frame_timeout", c.FrameTimeout, "stall_timeout", c.StallTimeout, "status_interval", c.StatusInterval, "allow_uids", c.AllowUIDs)
	return nil
}

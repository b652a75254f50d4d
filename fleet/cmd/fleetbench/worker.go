package main

import (
	"net"

	"github.com/listenhub/listenhub/frame"
)

// dialWorker is a worker of the hub at sock subscribed to name: every
// wake's payload goes to onWake. It returns its close once acked.
func dialWorker(sock, name string, onWake func(string)) (func(), error) {
	c, err := net.Dial("unix", sock)
	if err != nil {
		return nil, err
	}
	if _, err := c.Write(frame.AppendSub(nil, name)); err != nil {
		c.Close()
		return nil, err
	}
	acked := make(chan struct{})
	go func() {
		var dec frame.Decoder
		buf := make([]byte, 64<<10)
		ack := acked
		for {
			n, err := c.Read(buf)
			if err != nil {
				return
			}
			dec.Feed(buf[:n])
			for m, ok, _ := dec.Next(); ok; m, ok, _ = dec.Next() {
				switch {
				case m.Type == frame.TypeAck && ack != nil:
					close(ack)
					ack = nil
				case m.Type == frame.TypeWake && m.HasPayload:
					onWake(m.Payload)
				}
			}
		}
	}()
	<-acked
	return func() { c.Close() }, nil
}

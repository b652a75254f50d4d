package frame_test

import (
	"fmt"
	"io"
	"net"

	"github.com/listenhub/listenhub/frame"
)

// A worker speaking the protocol itself: it writes a sub, then reads
// whole messages off its end of the socket, however the bytes were cut.
func ExampleDecoder() {
	worker, hub := net.Pipe()
	go func() { // the hub's side of this example
		buf := make([]byte, 64)
		n, _ := hub.Read(buf)
		var d frame.Decoder
		d.Feed(buf[:n])
		sub, _, _ := d.Next()
		out := frame.AppendAck(nil, sub.Name)
		out = frame.AppendWake(out, sub.Name, []byte("hello"), true)
		out = frame.AppendWake(out, sub.Name, nil, false)
		for len(out) > 0 { // in pieces of 5 bytes
			n := min(5, len(out))
			hub.Write(out[:n])
			out = out[n:]
		}
		hub.Close()
	}()
	worker.Write(frame.AppendSub(nil, "orders"))
	var d frame.Decoder
	buf := make([]byte, 4096)
	for {
		n, err := worker.Read(buf)
		d.Feed(buf[:n])
		for {
			m, ok, derr := d.Next()
			if derr != nil {
				fmt.Println("malformed:", derr)
				return
			}
			if !ok {
				break
			}
			fmt.Println(m.Type, m.Name, m.Payload, m.HasPayload)
		}
		if err == io.EOF {
			return
		}
	}
	// Output:
	// ack orders  false
	// wake orders hello true
	// wake orders  false
}

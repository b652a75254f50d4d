package client_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/listenhub/listenhub/client"
	"github.com/listenhub/listenhub/hub"
)

// exampleSetup gives an example a running hub and its database. A real
// program has both from its configuration (LISTENHUB_SOCKET and
// DATABASE_URL, say); here they are the test binary's throwaway Postgres
// and a hub started in this process. notify sends NOTIFY channel, payload;
// stop stops the hub (the workers see EOF).
func exampleSetup() (socket, databaseURL string, notify func(channel, payload string), stop func()) {
	db := client.SharedTestDatabase()
	dir, err := os.MkdirTemp("", "lhx")
	if err != nil {
		log.Fatal(err)
	}
	socket = filepath.Join(dir, "listenhub.sock")
	stopHub := startExampleHub(socket, db.URL())
	notify = func(channel, payload string) {
		if err := db.Notify(context.Background(), channel, payload); err != nil {
			log.Fatal(err)
		}
	}
	stopped := false
	stop = func() {
		if stopped {
			return
		}
		stopped = true
		stopHub()
		os.RemoveAll(dir)
	}
	return socket, db.URL(), notify, stop
}

// restartExampleHub starts a hub again on the socket of an exampleSetup
// whose stop was called; its stop stops it and removes the directory.
func restartExampleHub(socket, databaseURL string) (stop func()) {
	dir := filepath.Dir(socket)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		log.Fatal(err)
	}
	stopHub := startExampleHub(socket, databaseURL)
	return func() {
		stopHub()
		os.RemoveAll(dir)
	}
}

// startExampleHub starts a hub on socket in this process; stop stops it.
func startExampleHub(socket, databaseURL string) (stop func()) {
	h, err := hub.New(hub.Config{
		SocketPath:      socket,
		DatabaseURL:     databaseURL,
		ApplicationName: "listenhub-example",
		Logger:          slog.New(slog.DiscardHandler),
	})
	if err != nil {
		log.Fatal(err)
	}
	if err := h.Start(context.Background()); err != nil {
		log.Fatal(err)
	}
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		h.Stop(ctx)
	}
}

// The hub client alone: subscribe, then receive every NOTIFY on the channel
// through OnWake.
func ExampleDial() {
	socket, _, notify, stop := exampleSetup()
	defer stop()
	ctx := context.Background()

	wakes := make(chan client.Wake, 64)
	c, err := client.Dial(ctx, client.Options{
		SocketPath: socket,
		// Runs on the client's reader goroutine: hand the wake off,
		// never block here.
	}, client.Handlers{OnWake: func(w client.Wake) { wakes <- w }})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	// Returns once the hub's LISTEN is confirmed by Postgres: every
	// NOTIFY committed from now on arrives.
	if err := c.Subscribe(ctx, "orders"); err != nil {
		log.Fatal(err)
	}
	notify("orders", `{"id":42}`) // ephemeral: the payload is the message
	notify("orders", "")          // durable: "something changed, re-read"
	for range 2 {
		w := <-wakes
		fmt.Printf("q=%s durable=%v payload=%q\n", w.Name, w.Durable, w.Payload)
	}
	// Output:
	// q=orders durable=false payload="{\"id\":42}"
	// q=orders durable=true payload=""
}

// A Failover uses the hub while it is there and its own Postgres
// connection after the hub fails; the durable wake after the swap tells a
// durable reader to re-read what it may have missed.
func ExampleNewFailover() {
	socket, databaseURL, notify, stopHub := exampleSetup()
	defer stopHub()
	ctx := context.Background()

	wakes := make(chan client.Wake, 64)
	f, err := client.NewFailover(ctx, client.FailoverOptions{
		Hub:   client.Options{SocketPath: socket},
		Local: client.LocalOptions{DatabaseURL: databaseURL}, // for the local listener, if ever needed
	}, client.FailoverHandlers{OnWake: func(w client.Wake) { wakes <- w }})
	if err != nil {
		log.Fatal(err)
	}
	defer f.Close()
	if err := f.Subscribe(ctx, "invoices"); err != nil {
		log.Fatal(err)
	}
	fmt.Println("mode:", f.Mode())
	notify("invoices", "via the hub")
	fmt.Println((<-wakes).Payload)

	stopHub() // the hub goes away
	w := <-wakes
	fmt.Println("mode:", f.Mode(), "- durable wake for", w.Name, w.Durable)
	notify("invoices", "via our own connection")
	fmt.Println((<-wakes).Payload)
	// Output:
	// mode: hub
	// via the hub
	// mode: local - durable wake for invoices true
	// via our own connection
}

// A Failover returns to a hub that is back: once the restarted hub has
// acked every name, it closes its own connection, calls OnFailback and
// delivers a durable wake per name (NOTIFYs committed during the swap may
// arrive twice, none is lost).
func ExampleFailoverOptions_failback() {
	socket, databaseURL, notify, stop := exampleSetup()
	defer stop()
	ctx := context.Background()

	wakes := make(chan client.Wake, 64)
	modes := make(chan string, 4)
	f, err := client.NewFailover(ctx, client.FailoverOptions{
		Hub:           client.Options{SocketPath: socket},
		Local:         client.LocalOptions{DatabaseURL: databaseURL},
		FailbackDelay: 100 * time.Millisecond, // default 5s: no flapping
	}, client.FailoverHandlers{OnWake: func(w client.Wake) { wakes <- w }, OnFailover: func(error) { modes <- "failed over" }, OnFailback: func() { modes <- "back on the hub" }})
	if err != nil {
		log.Fatal(err)
	}
	defer f.Close()
	if err := f.Subscribe(ctx, "invoices"); err != nil {
		log.Fatal(err)
	}

	stop() // the hub goes away...
	fmt.Println(<-modes, "- mode:", f.Mode())
	<-wakes // the failover's durable wake

	// ...and a new one starts on the same socket.
	stopAgain := restartExampleHub(socket, databaseURL)
	defer stopAgain()
	fmt.Println(<-modes, "- mode:", f.Mode())
	w := <-wakes
	fmt.Println("durable wake for", w.Name, w.Durable)
	notify("invoices", "via the hub again")
	fmt.Println((<-wakes).Payload)
	// Output:
	// failed over - mode: local
	// back on the hub - mode: hub
	// durable wake for invoices true
	// via the hub again
}

// With no hub at all, a Failover listens locally from the start and says
// why.
func ExampleFailover_Reason() {
	_, databaseURL, _, stop := exampleSetup()
	defer stop()
	f, err := client.NewFailover(context.Background(), client.FailoverOptions{
		Hub:   client.Options{SocketPath: "/nonexistent/listenhub.sock"},
		Local: client.LocalOptions{DatabaseURL: databaseURL},
	}, client.FailoverHandlers{})
	if err != nil {
		log.Fatal(err)
	}
	defer f.Close()
	fmt.Println(f.Mode(), errors.Is(f.Reason(), fs.ErrNotExist))
	// Output: local true
}

// A Mux gives many in-process subscribers one subscription per name.
func ExampleMux() {
	socket, databaseURL, notify, stop := exampleSetup()
	defer stop()
	ctx := context.Background()

	mux, err := client.NewMux(client.MuxOptions{Buffer: 64})
	if err != nil {
		log.Fatal(err)
	}
	defer mux.Close()
	f, err := client.NewFailover(ctx, client.FailoverOptions{
		Hub:   client.Options{SocketPath: socket},
		Local: client.LocalOptions{DatabaseURL: databaseURL},
	}, client.FailoverHandlers{OnWake: mux.OnWake})
	if err != nil {
		log.Fatal(err)
	}
	mux.Attach(f) // the Mux owns it: its Close closes f

	var subs []*client.Subscription
	for range 3 {
		s, err := mux.Subscribe(ctx, "chat")
		if err != nil {
			log.Fatal(err)
		}
		defer s.Close() // the last Close unsubscribes from the hub
		subs = append(subs, s)
	}
	fmt.Println("subscribers of chat:", mux.Subscribers("chat"))
	notify("chat", "hello")
	for i, s := range subs {
		w, err := s.Next(ctx)
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println(i, w.Payload)
	}
	// Output:
	// subscribers of chat: 3
	// 0 hello
	// 1 hello
	// 2 hello
}

// The client embedded in an HTTP server: each Server-Sent Events stream is
// a Mux subscriber, so a thousand browsers on one channel cost the process
// one hub subscription. A stream that falls behind is closed (its
// EventSource reconnects) rather than slowing the others.
func Example_serverSentEvents() {
	socket, databaseURL, notify, stop := exampleSetup()
	defer stop()
	ctx := context.Background()

	mux, err := client.NewMux(client.MuxOptions{})
	if err != nil {
		log.Fatal(err)
	}
	defer mux.Close()
	f, err := client.NewFailover(ctx, client.FailoverOptions{
		Hub:   client.Options{SocketPath: socket},
		Local: client.LocalOptions{DatabaseURL: databaseURL},
	}, client.FailoverHandlers{OnWake: mux.OnWake})
	if err != nil {
		log.Fatal(err)
	}
	mux.Attach(f) // the Mux owns it: its Close closes f

	events := func(w http.ResponseWriter, r *http.Request) {
		sub, err := mux.Subscribe(r.Context(), r.URL.Query().Get("q"))
		switch {
		case errors.Is(err, client.ErrInvalidName):
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		case err != nil:
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		defer sub.Close()
		flusher := w.(http.Flusher)
		w.Header().Set("Content-Type", "text/event-stream")
		w.Header().Set("Cache-Control", "no-cache")
		fmt.Fprint(w, ": subscribed\n\n") // every NOTIFY from now on arrives
		flusher.Flush()
		for {
			wake, err := sub.Next(r.Context())
			if err != nil {
				return // browser gone, too slow, or no listener left
			}
			if wake.Durable {
				fmt.Fprint(w, "event: changed\ndata:\n\n")
			} else {
				// One data: line per payload line, as SSE requires.
				fmt.Fprintf(w, "data: %s\n\n", strings.ReplaceAll(wake.Payload, "\n", "\ndata: "))
			}
			flusher.Flush()
		}
	}
	srv := httptest.NewServer(http.HandlerFunc(events))
	defer srv.Close()

	// A browser, as far as the server can tell.
	resp, err := http.Get(srv.URL + "/events?q=chat")
	if err != nil {
		log.Fatal(err)
	}
	defer resp.Body.Close()
	stream := bufio.NewReader(resp.Body)
	readEvent := func() string {
		var lines []string
		for {
			line, err := stream.ReadString('\n')
			if err != nil {
				log.Fatal(err)
			}
			if line == "\n" {
				return strings.Join(lines, "")
			}
			lines = append(lines, line)
		}
	}
	fmt.Print(resp.Header.Get("Content-Type"), "\n", readEvent())
	notify("chat", "hello, browser")
	fmt.Print(readEvent())
	notify("chat", "two\nlines")
	fmt.Print(readEvent())
	notify("chat", "")
	fmt.Print(readEvent())
	// Output:
	// text/event-stream
	// : subscribed
	// data: hello, browser
	// data: two
	// data: lines
	// event: changed
	// data:
}

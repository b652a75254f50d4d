// Command embed is a server that embeds the hub: the hub runs inside the
// server's process, its monitoring is served on the server's mux beside
// the server's pages, and a worker of the same process subscribes through
// the client, as a worker in another process would.
//
//	go run ./examples/embed --database-url postgres://app@db/app
//
// then curl http://127.0.0.1:8080/monitor/metrics (listenhub_workers 1),
// or listenhub status --metrics-addr http://127.0.0.1:8080/monitor.
package main

import (
	"context"
	"flag"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/listenhub/listenhub/client"
	"github.com/listenhub/listenhub/hub"
	"github.com/listenhub/listenhub/monitor"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:8080", "HTTP address")
	url := flag.String("database-url", "", "PostgreSQL URL (empty: libpq's PG* variables)")
	sock := flag.String("socket", filepath.Join(os.TempDir(), "embed.sock"), "the hub's socket")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ln, err := net.Listen("tcp", *addr)
	if err == nil {
		err = run(ctx, *url, *sock, ln)
	}
	if err != nil {
		log.Fatal(err)
	}
}

// run serves on ln until ctx is done.
func run(ctx context.Context, databaseURL, sock string, ln net.Listener) error {
	h, err := hub.New(hub.Config{SocketPath: sock, DatabaseURL: databaseURL})
	if err != nil {
		return err
	}
	if err := h.Start(ctx); err != nil {
		return err
	}
	defer func() {
		sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		h.Stop(sctx)
	}()

	mux := http.NewServeMux()
	mux.Handle("/monitor/", http.StripPrefix("/monitor", monitor.Handler(h, monitor.Options{})))
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go srv.Serve(ln)
	defer srv.Close()

	worker, err := client.Dial(ctx, client.Options{
		SocketPath: sock,
	}, client.Handlers{OnWake: func(w client.Wake) { log.Printf("wake: %s %q", w.Name, w.Payload) }})
	if err != nil {
		return err
	}
	defer worker.Close()
	if err := worker.Subscribe(ctx, "jobs"); err != nil {
		return err
	}
	<-ctx.Done()
	return nil
}

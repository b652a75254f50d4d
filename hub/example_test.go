package hub_test

import (
	"context"
	"log"
	"os"
	"os/signal"
	"syscall"

	"github.com/listenhub/listenhub/hub"
)

// Embedding: the master of a preforking server runs the hub in-process and
// its workers connect to the socket (client.Dial). Stats is safe from any
// goroutine, e.g. a metrics endpoint.
func Example() {
	h, err := hub.New(hub.Config{
		SocketPath:  "/run/myapp/listenhub.sock",
		DatabaseURL: os.Getenv("DATABASE_URL"),
	})
	if err != nil {
		log.Fatal(err)
	}
	if err := h.Start(context.Background()); err != nil {
		log.Fatal(err) // the socket cannot be bound, or another hub owns it
	}
	// Workers are accepted from here on; Postgres is reached in the
	// background (healthy:false until then, retried while unreachable).
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()

	// ... fork the workers here ...

	select {
	case <-ctx.Done():
	case <-h.Done():
		// Postgres refused the configuration (bad password, no such
		// database): retrying cannot help.
		log.Printf("hub stopped: %v", h.Wait())
	}
	log.Printf("served %d accepts", h.Stats().Accepts)
	if err := h.Stop(context.Background()); err != nil {
		log.Print(err)
	}
}

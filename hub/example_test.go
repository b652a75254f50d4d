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
		log.Fatal(err) // Postgres unreachable, or another hub owns the socket
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()

	// ... fork the workers here ...

	select {
	case <-ctx.Done():
	case <-h.Done():
		log.Printf("hub died: %v", h.Wait())
	}
	log.Printf("served %d accepts", h.Stats().Accepts)
	if err := h.Stop(context.Background()); err != nil {
		log.Print(err)
	}
}

package hub

import (
	"context"
	"errors"

	"github.com/listenhub/listenhub/loop"
)

func openListener(ctx context.Context, l *loop.Loop, h *Hub) (postgres, error) {
	return nil, errors.New("listener not wired yet")
}

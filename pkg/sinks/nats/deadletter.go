package nats

import (
	"context"

	natsgo "github.com/nats-io/nats.go"

	"github.com/kubebridge/kubebridge/pkg/event"
)

// DeadLetter publishes refused events to a subject over an existing
// connection, with the error in the Kubebridge-Error header.
type DeadLetter struct {
	NC      *natsgo.Conn
	Subject string
}

// Put publishes the events and flushes.
func (d *DeadLetter) Put(ctx context.Context, sink string, events []*event.Event, cause error) error {
	for _, e := range events {
		body, err := e.Structured()
		if err != nil {
			return err
		}
		msg := natsgo.NewMsg(d.Subject)
		msg.Data = body
		msg.Header.Set("Kubebridge-Error", cause.Error())
		msg.Header.Set("Kubebridge-Sink", sink)
		msg.Header.Set("ce-id", e.ID)
		if err := d.NC.PublishMsg(msg); err != nil {
			return err
		}
	}
	return d.NC.FlushWithContext(ctx)
}

package bridge

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"time"

	"github.com/kubebridge/kubebridge/internal/delivery"
	"github.com/kubebridge/kubebridge/internal/view"
	"github.com/kubebridge/kubebridge/pkg/config"
	"github.com/kubebridge/kubebridge/pkg/sinks"
)

// sinkSet is the sinks in use, in config order, immutable once published:
// a reload builds a new one (buildSinkSet) and retires what it replaced.
type sinkSet struct {
	byName map[string]*sinkRun
	order  []*sinkRun
}

// sinkRun is one sink in use: its config, the sink, its delivery and the
// view it was handed. delivery and handed are set once it starts
// (deliverer.startRun); a run kept across a reload keeps them.
type sinkRun struct {
	cfg      config.Sink
	sink     sinks.Sink
	delivery *delivery.Delivery
	handed   *view.Handed
	cancel   context.CancelFunc // stops the delivery at once
	closers  []func(context.Context) error
}

// sinkCreator builds sinks: a *sinks.Registry, or what shares one sink
// among the deliverers of several shards (sharedSinks).
type sinkCreator interface {
	Create(ctx context.Context, sc config.Sink, logger *slog.Logger) (sinks.Sink, error)
}

// buildSinkSet builds the set for cfgs. A sink whose config equals its run
// in prev keeps that run (queue, worker and view go on); the others are
// built by reg. retired lists prev's runs that the new set does not keep
// (changed or removed). Nothing changes until the caller publishes next: on
// error what was built is closed and prev is untouched.
func buildSinkSet(ctx context.Context, reg sinkCreator, cfgs []config.Sink, prev *sinkSet, logger *slog.Logger) (next *sinkSet, retired []*sinkRun, err error) {
	next = &sinkSet{byName: map[string]*sinkRun{}}
	var built []*sinkRun
	for _, sc := range cfgs {
		run := prev.kept(sc)
		if run == nil {
			sink, err := reg.Create(ctx, sc, logger.With("sink", sc.Name))
			if err != nil {
				for _, b := range built {
					_ = b.close(ctx)
				}
				return nil, nil, fmt.Errorf("sink %q: %w", sc.Name, err)
			}
			run = &sinkRun{cfg: sc, sink: sink}
			built = append(built, run)
		}
		next.byName[sc.Name], next.order = run, append(next.order, run)
	}
	if prev != nil {
		for _, run := range prev.order {
			if next.byName[run.cfg.Name] != run {
				retired = append(retired, run)
			}
		}
	}
	return next, retired, nil
}

// kept returns the run of set that a sink configured as sc can go on
// with: same name, same settings.
func (set *sinkSet) kept(sc config.Sink) *sinkRun {
	if set == nil {
		return nil
	}
	if run := set.byName[sc.Name]; run != nil && reflect.DeepEqual(run.cfg, sc) {
		return run
	}
	return nil
}

// runs returns the set's runs in config order (none for no set).
func (set *sinkSet) runs() []*sinkRun {
	if set == nil {
		return nil
	}
	return set.order
}

// deliveries returns the started deliveries, in config order.
func (set *sinkSet) deliveries() []*delivery.Delivery {
	var out []*delivery.Delivery
	for _, s := range set.runs() {
		if s.delivery != nil {
			out = append(out, s.delivery)
		}
	}
	return out
}

// retire stops a run a reload replaced (stopRuns, draining for up to
// drain: what is left is dropped; the successor's reconciliation against
// the checkpoint, which holds only what was acknowledged, sends it again)
// and closes the sink.
func (s *sinkRun) retire(ctx context.Context, drain time.Duration, logger *slog.Logger) {
	dctx, cancel := context.WithTimeout(ctx, drain)
	left := stopRuns(dctx, []*sinkRun{s})
	cancel()
	if left > 0 {
		logger.Warn("sink did not drain in time; its queue is dropped (its successor resends it from the checkpoint)", "sink", s.cfg.Name, "pending", left)
	}
	ctx, cancel = context.WithTimeout(context.WithoutCancel(ctx), closeTimeout)
	defer cancel()
	if err := s.close(ctx); err != nil {
		logger.Warn("closing a replaced sink", "sink", s.cfg.Name, "error", err)
	}
}

// stopRuns stops the deliveries of runs, the one way they stop: their
// views take no more notifications, their queues drain into their sinks
// until ctx ends (a cancelled ctx: not at all), then their workers stop.
// It returns how many events were left undelivered.
func stopRuns(ctx context.Context, runs []*sinkRun) (left int) {
	var started []*sinkRun
	for _, s := range runs {
		if s.delivery != nil {
			started = append(started, s)
			s.handed.Stop()
			s.delivery.Close()
		}
	}
	for _, s := range started {
		select {
		case <-s.delivery.Done():
		case <-ctx.Done():
			left += s.delivery.Pending()
		}
	}
	for _, s := range started {
		s.cancel()
		<-s.delivery.Done()
	}
	return left
}

// close closes the sink and its dead-letter (once its delivery stopped).
func (s *sinkRun) close(ctx context.Context) error {
	var errs []error
	if s.sink != nil {
		errs = append(errs, s.sink.Close(ctx))
		s.sink = nil
	}
	for _, c := range s.closers {
		errs = append(errs, c(ctx))
	}
	s.closers = nil
	return errors.Join(errs...)
}

// run returns the run of the sink named name, nil if none (or no set).
func (set *sinkSet) run(name string) *sinkRun {
	if set == nil {
		return nil
	}
	return set.byName[name]
}

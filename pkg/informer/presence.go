package informer

import (
	"context"
	"fmt"
	"time"

	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/kubebridge/kubebridge/pkg/filters"
)

// DefaultPollEvery is how often the cluster is asked whether the rules'
// resources are served.
const DefaultPollEvery = 10 * time.Second

// poll follows whether each informer's resource is served, until ctx
// ends: an absent resource's informer starts when it appears, and one
// that goes away (a CRD deleted: the apiserver deletes its objects, then
// stops serving it) is stopped and replaced by an empty one, so that its
// rules' views hold nothing, as the cluster does.
func (in *Informers) poll(ctx context.Context) {
	every := in.PollEvery
	if every <= 0 {
		every = DefaultPollEvery
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		served := map[schema.GroupVersionResource]bool{}
		for _, run := range in.running {
			gvr := run.Spec.GVR
			present, seen := served[gvr]
			if !seen {
				var err error
				present, err = in.Discover(ctx, gvr)
				if err != nil {
					if ctx.Err() == nil {
						in.logger.Debug("discovery failed; asking again later", "resource", gvr.String(), "error", err)
					}
					continue // unknown: nothing changes
				}
				served[gvr] = present
			}
			in.mu.Lock()
			if in.stopped { // Stop stopped every instance: none starts after it
				in.mu.Unlock()
				return
			}
			gone := false
			switch {
			case present && run.absent.Load():
				in.appeared(ctx, run)
			case !present && !run.absent.Load():
				gone = in.disappeared(run)
			}
			in.mu.Unlock()
			// Outside in.mu: the receiver reconciles, which may wait for a
			// Reselect, which takes in.mu.
			if gone && in.OnChange != nil {
				in.OnChange(run.Rules)
			}
		}
	}
}

// appeared starts run's informer and, once it synced, has its rules'
// views reconciled (the list's adds were notified as they came).
func (in *Informers) appeared(ctx context.Context, run *running) {
	in.logger.Info("the cluster serves the resource now; its rules start", "informer", run.Spec.String(), "rules", ruleNames(run.Rules))
	inst := run.cur.Load()
	run.late.Store(true)
	run.absent.Store(false)
	in.startInstance(inst)
	in.wg.Add(1)
	go func() {
		defer in.wg.Done()
		if !waitFor(ctx, inst.synced) {
			return
		}
		if in.OnChange != nil && run.cur.Load() == inst {
			in.OnChange(run.Rules)
		}
	}()
}

// disappeared stops run's informer and puts an empty one, not started, in
// its place, and reports whether it did: the caller then has the rules'
// views reconciled to nothing (OnChange), outside in.mu.
func (in *Informers) disappeared(run *running) bool {
	in.logger.Warn("the cluster no longer serves the resource; its rules' objects are gone, the rules wait for it", "informer", run.Spec.String(), "rules", ruleNames(run.Rules))
	old := run.cur.Load()
	fresh, err := in.prepare(run)
	if err != nil {
		in.logger.Error("cannot prepare the informer for the resource's return", "informer", run.Spec.String(), "error", err)
		return false
	}
	run.absent.Store(true)
	if old.cancel != nil {
		old.cancel()
		<-old.done
	}
	run.cur.Store(fresh)
	return true
}

// Waiting lists the rules that do not hold their view now, and why: the
// cluster does not serve their resource, or its informer has not listed
// it yet (a resource that appeared after the start; a list refused).
func (in *Informers) Waiting() map[*filters.Rule]error {
	out := map[*filters.Rule]error{}
	for _, run := range in.running {
		var err error
		switch {
		case run.absent.Load():
			err = fmt.Errorf("the cluster does not serve %s (is the CRD installed?); the rule starts when it does", run.Spec.GVR.String())
		case !run.cur.Load().synced():
			err = fmt.Errorf("listing %s", run.Spec.String())
			if last, _ := run.lastErr.Load().(string); last != "" {
				err = fmt.Errorf("listing %s: %s", run.Spec.String(), last)
			}
		default:
			continue
		}
		for _, r := range run.Rules {
			if out[r] == nil {
				out[r] = err
			}
		}
	}
	return out
}

func ruleNames(rules []*filters.Rule) []string {
	out := make([]string, len(rules))
	for i, r := range rules {
		out[i] = r.Name
	}
	return out
}

package main

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// load writes n ConfigMaps of about 1 KiB into ns: it creates them all,
// then updates each once, then deletes them all; 3n changes. With rate 0
// the writes go as fast as the apiserver takes them (workers in parallel);
// otherwise they are paced at rate changes per second.
type load struct {
	cs      kubernetes.Interface
	ns      string
	n       int
	rate    int
	workers int
}

// payload is ~1 KiB of text that differs per object and per revision, so
// every update is a real change.
func payload(i, rev int) string {
	var b strings.Builder
	b.Grow(1024)
	seed := uint32(i*7919 + rev*104729 + 1)
	for b.Len() < 1000 {
		seed = seed*1664525 + 1013904223
		b.WriteByte("abcdefghijklmnopqrstuvwxyz0123456789"[seed>>16%36])
	}
	return b.String()
}

func objectName(i int) string { return fmt.Sprintf("bench-%06d", i) }

func configMap(ns string, i, rev int) *corev1.ConfigMap {
	return &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: objectName(i), Namespace: ns, Labels: map[string]string{"app": "bench", "shard": fmt.Sprint(i % 16)}},
		Data:       map[string]string{"payload": payload(i, rev), "revision": fmt.Sprint(rev)},
	}
}

// run performs the writes; it returns when all 3n are acknowledged by the
// apiserver, with the time the first write was sent.
func (l *load) run(ctx context.Context) (start time.Time, err error) {
	start = time.Now()
	objs := make([]*corev1.ConfigMap, l.n)
	var op atomic.Int64 // index of the next change across the three phases
	phase := func(apply func(i int) error) error {
		var wg sync.WaitGroup
		var mu sync.Mutex
		var first error
		var next atomic.Int64
		for w := 0; w < l.workers; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					i := int(next.Add(1) - 1)
					if i >= l.n || ctx.Err() != nil {
						return
					}
					if l.rate > 0 { // pace: change k is due at start + k/rate
						due := start.Add(time.Duration(op.Add(1)-1) * time.Second / time.Duration(l.rate))
						time.Sleep(time.Until(due))
					}
					if err := apply(i); err != nil {
						mu.Lock()
						if first == nil {
							first = err
						}
						mu.Unlock()
						return
					}
				}
			}()
		}
		wg.Wait()
		return first
	}
	cms := l.cs.CoreV1().ConfigMaps(l.ns)
	if err := phase(func(i int) error {
		o, err := cms.Create(ctx, configMap(l.ns, i, 0), metav1.CreateOptions{})
		objs[i] = o
		return err
	}); err != nil {
		return start, fmt.Errorf("create: %w", err)
	}
	if err := phase(func(i int) error {
		o := objs[i].DeepCopy()
		o.Data = configMap(l.ns, i, 1).Data
		_, err := cms.Update(ctx, o, metav1.UpdateOptions{})
		return err
	}); err != nil {
		return start, fmt.Errorf("update: %w", err)
	}
	if err := phase(func(i int) error {
		return cms.Delete(ctx, objectName(i), metav1.DeleteOptions{})
	}); err != nil {
		return start, fmt.Errorf("delete: %w", err)
	}
	return start, nil
}

// fill creates ConfigMaps from..to-1 in ns (for the memory runs).
func fill(ctx context.Context, cs kubernetes.Interface, ns string, from, to, workers int) error {
	return createAll(ctx, from, to, workers, func(i int) error {
		_, err := cs.CoreV1().ConfigMaps(ns).Create(ctx, configMap(ns, i, 0), metav1.CreateOptions{})
		return err
	})
}

// createAll calls create for from..to-1 on workers goroutines, stopping at
// the first error, which it returns.
func createAll(ctx context.Context, from, to, workers int, create func(i int) error) error {
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := from + int(next.Add(1)-1)
				if i >= to || ctx.Err() != nil {
					return
				}
				if err := create(i); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	return <-errs
}

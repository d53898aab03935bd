package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"runtime"
	"sync/atomic"
	"syscall"
	"time"

	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
)

// watchReport is what the baseline process prints on stdout, one JSON line.
type watchReport struct {
	Events    int64 `json:"events"`
	LastNanos int64 `json:"lastNanos"` // wall clock of the last event
	Objects   int   `json:"objects"`
	HeapBytes int64 `json:"heapBytes"` // live heap after a forced GC
	RSSBytes  int64 `json:"rssBytes"`
	// PeakRSSBytes is the resident set's high-water mark (VmHWM).
	PeakRSSBytes int64 `json:"peakRSSBytes"`
}

// watchMain is the baseline: a bare client-go shared informer with a no-op
// handler that only counts, as a user would write it. It prints "synced",
// then either a report once expect events arrived (throughput runs) or,
// with -memory, a report of its memory with the cache full, and then waits
// for SIGTERM.
func watchMain(args []string) error {
	fs := flag.NewFlagSet("watch", flag.ContinueOnError)
	kubeconfig := fs.String("kubeconfig", "", "kubeconfig")
	ns := fs.String("namespace", "", "namespace")
	expect := fs.Int64("expect", 0, "exit after this many events")
	typed := fs.Bool("typed", false, "typed informer (corev1.ConfigMap) instead of a dynamic one")
	memory := fs.Bool("memory", false, "report memory after the sync, then wait")
	if err := fs.Parse(args); err != nil {
		return err
	}
	rc, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
	if err != nil {
		return err
	}
	rc.QPS, rc.Burst = 1000, 2000
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()

	var inf cache.SharedIndexInformer
	if *typed {
		cs, err := kubernetes.NewForConfig(rc)
		if err != nil {
			return err
		}
		inf = informers.NewSharedInformerFactoryWithOptions(cs, 0, informers.WithNamespace(*ns)).Core().V1().ConfigMaps().Informer()
	} else {
		dyn, err := dynamic.NewForConfig(rc)
		if err != nil {
			return err
		}
		gvr := schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}
		inf = dynamicinformer.NewFilteredDynamicSharedInformerFactory(dyn, 0, *ns, nil).ForResource(gvr).Informer()
	}
	var events, last atomic.Int64
	done := make(chan struct{})
	count := func() {
		last.Store(time.Now().UnixNano())
		if events.Add(1) == *expect {
			close(done)
		}
	}
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerDetailedFuncs{
		AddFunc: func(_ any, initial bool) {
			if !initial { // the initial list is not part of the throughput runs
				count()
			}
		},
		UpdateFunc: func(any, any) { count() },
		DeleteFunc: func(any) { count() },
	}); err != nil {
		return err
	}
	go inf.Run(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		return fmt.Errorf("informer did not sync")
	}
	fmt.Println("synced")
	report := func() watchReport {
		return watchReport{Events: events.Load(), LastNanos: last.Load(), Objects: len(inf.GetStore().ListKeys()),
			PeakRSSBytes: procStatus(os.Getpid(), "VmHWM:")}
	}
	if *memory {
		r := report()
		r.HeapBytes, r.RSSBytes = liveHeap(), rss(os.Getpid())
		if err := json.NewEncoder(os.Stdout).Encode(r); err != nil {
			return err
		}
		<-ctx.Done()
		runtime.KeepAlive(inf)
		return nil
	}
	select {
	case <-done:
	case <-ctx.Done():
	}
	return json.NewEncoder(os.Stdout).Encode(report())
}

// liveHeap is the heap in use after a full collection.
func liveHeap() int64 {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return int64(ms.HeapAlloc)
}

package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"runtime"
	"runtime/pprof"
	"sync/atomic"
	"syscall"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
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
	// CPUSeconds is the process's user+system time when it reported.
	CPUSeconds float64 `json:"cpuSeconds"`
	// Disconnects counts the NATS connections lost (mirrorwatch).
	Disconnects int64 `json:"disconnects,omitempty"`
}

// watchMain is the baseline: a bare client-go shared informer with a no-op
// handler that only counts, as a user would write it. It prints "synced",
// then either a report once expect events arrived (throughput runs) or,
// with -memory, a report of its memory with the cache full, and then waits
// for SIGTERM. With -initial N it prints only a report, as soon as its
// handler got N adds of the initial list (cold runs), and exits.
func watchMain(args []string) error {
	fs := flag.NewFlagSet("watch", flag.ContinueOnError)
	kubeconfig := fs.String("kubeconfig", "", "kubeconfig")
	ns := fs.String("namespace", "", "namespace")
	expect := fs.Int64("expect", 0, "exit after this many events")
	typed := fs.Bool("typed", false, "typed informer (corev1.ConfigMap) instead of a dynamic one")
	resource := fs.String("resource", "configmaps", "core v1 resource the dynamic informer watches (configmaps, secrets)")
	memory := fs.Bool("memory", false, "report memory after the sync, then wait")
	initial := fs.Int64("initial", 0, "report and exit once the handler got this many adds of the initial list")
	cpuProfile := fs.String("cpuprofile", "", "write a CPU profile of the whole run (with -initial: until the report) to this file")
	strip := fs.Bool("strip-managed-fields", false, "drop metadata.managedFields before caching (cache.TransformStripManagedFields), as the bridge's events do")
	if err := fs.Parse(args); err != nil {
		return err
	}
	stopProfile, err := startCPUProfile(*cpuProfile)
	if err != nil {
		return err
	}
	defer stopProfile()
	rc, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
	if err != nil {
		return err
	}
	rc.QPS, rc.Burst = 1000, 2000
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()

	if *typed && *resource != "configmaps" {
		return fmt.Errorf("-typed watches configmaps only, not %s", *resource)
	}
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
		gvr := schema.GroupVersionResource{Version: "v1", Resource: *resource}
		inf = dynamicinformer.NewFilteredDynamicSharedInformerFactory(dyn, 0, *ns, nil).ForResource(gvr).Informer()
	}
	if *strip {
		if err := inf.SetTransform(stripManagedFields); err != nil {
			return err
		}
	}
	var events, last, initials atomic.Int64
	done := make(chan struct{})
	// The report is taken in the handler that completes the count, so that
	// its time and CPU are those of the moment the last object arrived.
	var initialReport watchReport
	initialDone := make(chan struct{})
	count := func() {
		last.Store(time.Now().UnixNano())
		if events.Add(1) == *expect {
			close(done)
		}
	}
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerDetailedFuncs{
		AddFunc: func(_ any, isInitial bool) {
			if isInitial {
				if initials.Add(1) == *initial {
					initialReport = watchReport{Events: *initial, LastNanos: time.Now().UnixNano(), CPUSeconds: selfCPU(),
						PeakRSSBytes: procStatus(os.Getpid(), "VmHWM:")}
					close(initialDone)
				}
				return // the initial list is not part of the throughput runs
			}
			count()
		},
		UpdateFunc: func(any, any) { count() },
		DeleteFunc: func(any) { count() },
	}); err != nil {
		return err
	}
	go inf.Run(ctx.Done())
	if *initial > 0 {
		select {
		case <-initialDone:
		case <-ctx.Done():
			return fmt.Errorf("stopped after %d of %d initial adds", initials.Load(), *initial)
		}
		return json.NewEncoder(os.Stdout).Encode(initialReport)
	}
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

// startCPUProfile starts a CPU profile into path ("": none); the
// returned function stops it.
func startCPUProfile(path string) (func(), error) {
	if path == "" {
		return func() {}, nil
	}
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, err
	}
	return func() { pprof.StopCPUProfile(); f.Close() }, nil
}

// stripManagedFields is the usual informer transform that drops
// metadata.managedFields before an object is cached.
func stripManagedFields(obj any) (any, error) {
	if a, err := meta.Accessor(obj); err == nil {
		a.SetManagedFields(nil)
	}
	return obj, nil
}

// selfCPU is this process's user+system CPU time so far.
func selfCPU() float64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()).Seconds()
}

// liveHeap is the heap in use after a full collection.
func liveHeap() int64 {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return int64(ms.HeapAlloc)
}

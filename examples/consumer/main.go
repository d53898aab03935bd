// Command consumer follows a kubebridge rule's view from its NATS KV
// mirror bucket with a client-go informer, and prints what changes in it.
// It never talks to the apiserver. See docs/mirror.md.
//
//	consumer -url nats://127.0.0.1:4222 -bucket kubebridge-myrule
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/tools/cache"

	"github.com/kubebridge/kubebridge/pkg/mirror"
)

func main() {
	url := flag.String("url", nats.DefaultURL, "the NATS server")
	bucket := flag.String("bucket", "", "the rule's mirror bucket")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, *url, *bucket, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

// run prints the view's changes to out until ctx ends.
func run(ctx context.Context, url, bucket string, out io.Writer) error {
	nc, err := nats.Connect(url, nats.MaxReconnects(-1))
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	kv, err := js.KeyValue(ctx, bucket)
	if err != nil {
		return fmt.Errorf("bucket %s: %w", bucket, err)
	}
	lw := mirror.NewListerWatcher(kv, mirror.Options{})
	inf := cache.NewSharedIndexInformer(lw, &unstructured.Unstructured{}, 0, cache.Indexers{})
	print := func(what string, o any) {
		if d, ok := o.(cache.DeletedFinalStateUnknown); ok {
			o = d.Obj // deleted while the informer was not watching
		}
		u := o.(*unstructured.Unstructured)
		fmt.Fprintf(out, "%s %s/%s", what, u.GetNamespace(), u.GetName())
		if rv := u.GetAnnotations()[mirror.ResourceVersionAnnotation]; rv != "" {
			fmt.Fprintf(out, " (%s, resourceVersion %s)", u.GetKind(), rv) // the apiserver's
		}
		fmt.Fprintln(out)
	}
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(o any) { print("added", o) },
		UpdateFunc: func(_, o any) { print("updated", o) },
		DeleteFunc: func(o any) { print("deleted", o) },
	}); err != nil {
		return err
	}
	inf.RunWithContext(ctx) // returns when ctx ends, its goroutines done
	return nil
}

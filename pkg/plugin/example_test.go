package plugin_test

import (
	"context"
	"errors"
	"os"
	"strings"

	"github.com/kubebridge/kubebridge/pkg/plugin"
	"github.com/kubebridge/kubebridge/pkg/sinks"
)

// Serve on two event lines, as the exec sink writes them: the handler's
// error is the answer. (A real plugin calls plugin.Run, which serves stdin
// and stdout.)
func ExampleServe() {
	events := `{"specversion":"1.0","id":"u1.0a1b2c3d4e5f.41.added","source":"kubebridge/dev","type":"io.kubebridge.configmaps.core.added","subject":"demo/settings","time":"2026-01-02T03:04:05Z","datacontenttype":"application/json","kbrule":"cms","kbcluster":"dev","data":{"object":{"metadata":{"labels":{"team":"pay"}}}}}
{"specversion":"1.0","id":"u2.0a1b2c3d4e5f.42.deleted","source":"kubebridge/dev","type":"io.kubebridge.configmaps.core.deleted","subject":"demo/legacy","time":"2026-01-02T03:04:06Z","datacontenttype":"application/json","kbrule":"cms","kbcluster":"dev","data":{"object":{"metadata":{}}}}
`
	handler := func(ctx context.Context, e plugin.Event) error {
		if e.Labels()["team"] == "" {
			return sinks.Permanent(errors.New(e.Subject + " has no team label"))
		}
		return nil // acknowledged
	}
	err := plugin.Serve(context.Background(), strings.NewReader(events), os.Stdout, handler, plugin.Concurrency(1))
	if err != nil {
		panic(err)
	}
	// Output:
	// {"id":"u1.0a1b2c3d4e5f.41.added","ok":true}
	// {"id":"u2.0a1b2c3d4e5f.42.deleted","ok":false,"error":"demo/legacy has no team label","permanent":true}
}

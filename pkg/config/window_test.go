package config_test

import (
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	. "github.com/kubebridge/kubebridge/pkg/config"
)

// An update window is written back in the form it is read: a duration
// without key, a mapping with one.
func TestUpdateWindowMarshalsAsRead(t *testing.T) {
	for _, tc := range []struct {
		w    UpdateWindow
		want string
	}{
		{UpdateWindow{Every: Duration(30 * time.Second)}, "30s\n"},
		{UpdateWindow{Every: Duration(10 * time.Minute), Key: "object.reason"}, "every: 10m0s\nkey: object.reason\nmaxKeys: 0\n"},
	} {
		out, err := yaml.Marshal(tc.w)
		if err != nil || string(out) != tc.want {
			t.Errorf("%+v marshals to %q (%v), want %q", tc.w, out, err, tc.want)
		}
	}
}

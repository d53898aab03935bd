package webhook_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/kubebridge/kubebridge/pkg/components"
	"github.com/kubebridge/kubebridge/pkg/config"
)

// An alert posted to Alertmanager expires at its endsAt unless sent again,
// so validate checks the sink's replay against it: a preset that would let
// alerts expire while their objects are still in the view is refused
// (naming replayEvery); a hand-written request posting to /api/v2/alerts
// gets the same words as a warning.
func TestAlertsMustOutliveTheirResends(t *testing.T) {
	const doc = `apiVersion: kubebridge.io/v1alpha1
kind: BridgeConfig
cluster: dev
sinks:
  - name: other
    file: {path: /tmp/x}
  - name: am
    webhook:
%s
rules:
  - {name: r, resource: v1/pods, sinks: [other, am]}
`
	const preset = "      url: http://127.0.0.1:9093/api/v2/alerts\n      preset: alertmanager"
	const handWritten = "      url: http://127.0.0.1:9093/api/v2/alerts\n      request:\n        body: >-\n" +
		`          [{"labels": {"alertname": "PodFailed", "pod": object.metadata.name}, "startsAt": event.time,` + "\n" +
		`            "endsAt": type == "deleted" ? event.time : string(timestamp(event.time) + duration("10m"))}]`
	for _, tc := range []struct {
		name, sink, replay string
		err, warning       string // "" none; else a part of the one problem
	}{
		{"preset without a replay", preset, "", "c.yaml:7: sinks[1].replayEvery: the alerts this sink posts end 5m0s after each send (endsAt): without a replay to send them again they expire while their objects are still in the view; set replayEvery to 1m15s or less", ""},
		{"preset, a replay longer than endsAt", preset, "30m", "c.yaml:11: sinks[1].replayEvery: 30m0s: the alerts this sink posts end 5m0s after each send (endsAt), so one late re-send expires an alert", ""},
		{"preset, half of endsAt: one late re-send expires it", preset, "3m", "sinks[1].replayEvery: 3m0s", ""},
		{"preset, fewer than 4 re-sends in endsAt", preset, "2m", "", "fewer than 4 re-sends fit in that, so a few failed ones expire an alert; 1m15s or less is safer"},
		{"preset, as Prometheus", preset, "1m", "", ""},
		{"preset whose endsAt is overridden", "      url: http://127.0.0.1:9093/api/v2/alerts\n      preset: alertmanager\n      request:\n        body: >-\n" +
			`          [{"labels": {"a": "b"}, "endsAt": string(timestamp(event.time) + duration("1h"))}]`, "10m", "", ""},
		{"hand-written, without a replay", handWritten, "", "", "sinks[1].replayEvery: the alerts this sink posts end 10m0s after each send (endsAt): without a replay"},
		{"hand-written, a replay longer than endsAt", handWritten, "30m", "", "sinks[1].replayEvery: 30m0s: the alerts this sink posts end 10m0s after each send"},
		{"hand-written, as Prometheus", handWritten, "2m", "", ""},
		{"hand-written without endsAt: Alertmanager's resolve_timeout", "      url: http://127.0.0.1:9093/\n      request:\n        path: \"'api/v2/alerts'\"\n        body: '[{\"labels\": {\"a\": \"b\"}}]'", "", "", "end 5m0s after each send"},
		{"not an alert receiver", "      url: https://hooks.slack.com/services/T/B/X\n      preset: slack", "", "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sink := tc.sink
			if tc.replay != "" {
				sink += "\n    replayEvery: " + tc.replay
			}
			_, warns, err := config.Parse("c.yaml", []byte(fmt.Sprintf(doc, sink)), components.SinkRegistry())
			switch {
			case tc.err == "" && err != nil:
				t.Errorf("refused: %v", err)
			case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err) || strings.Count(err.Error(), "\n") > 1):
				t.Errorf("got %v, want one error with %q", err, tc.err)
			}
			var got []string
			for _, w := range warns {
				got = append(got, w.Format("c.yaml"))
			}
			if (tc.warning == "") != (len(got) == 0) || len(got) > 1 || tc.warning != "" && !strings.Contains(got[0], tc.warning) {
				t.Errorf("warnings %q, want one with %q", got, tc.warning)
			}
		})
	}
}

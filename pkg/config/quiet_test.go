package config_test

import (
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	. "github.com/kubebridge/kubebridge/pkg/config"
)

// A digest and a mute are read with their defaults, and what cannot be
// parsed is an error at its key: a misspelt time zone, a day, a time of
// day, an empty window, a group expression that is no string.
func TestDigestAndMuteAreCheckedAtTheirKeys(t *testing.T) {
	const old = "      url: https://hooks.example.com/k8s\n"
	cfg := mustParse(t, mutate(t, base, old, old+`      preset: slack
    digest: {every: 5m, groupBy: object.metadata.namespace}
    mute: {windows: [{days: [sat, SUN], from: "22:00", to: "07:00", timeZone: Europe/Berlin}], where: "type != 'deleted'"}
`))
	s := cfg.Sinks[1]
	if s.Digest.Every.D() != 5*time.Minute || s.Digest.Max != DefaultDigestMax || s.Mute.Windows[0].TimeZone != "Europe/Berlin" {
		t.Errorf("digest %+v, mute %+v", s.Digest, s.Mute)
	}
	for _, tc := range []struct {
		name, block string
		want        []string
		bare        bool // the webhook without a preset (no digest body)
	}{
		{"time zone", `mute: {windows: [{from: "22:00", to: "07:00", timeZone: Europe/Berln}]}`,
			[]string{`config.yaml:13: sinks[1].mute.windows[0].timeZone: unknown time zone "Europe/Berln" (an IANA name, e.g. Europe/Berlin or UTC)`}, false},
		{"Local is the machine's, not a zone", `mute: {windows: [{from: "22:00", to: "07:00", timeZone: Local}]}`,
			[]string{`config.yaml:13: sinks[1].mute.windows[0].timeZone: unknown time zone "Local"…`}, false},
		{"day and times", `mute: {windows: [{days: [sat, sonntag], from: "7:00", to: "24:01"}]}`,
			[]string{`config.yaml:13: sinks[1].mute.windows[0].days[1]: unknown day "sonntag": write mon, tue, wed, thu, fri, sat or sun`,
				`config.yaml:13: sinks[1].mute.windows[0].from: "7:00" is not a time of day: write HH:MM or HH:MM:SS, 00:00 to 23:59:59`,
				`config.yaml:13: sinks[1].mute.windows[0].to: "24:01" is not a time of day: write HH:MM or HH:MM:SS, 00:00 to 24:00`}, false},
		{"empty window", `mute: {windows: [{from: "08:00", to: "08:00:00"}]}`,
			[]string{`config.yaml:13: sinks[1].mute.windows[0].to: equals from: the window is empty (a whole day is from 00:00 to 24:00)`}, false},
		{"no window", `mute: {where: "true"}`,
			[]string{`config.yaml:13: sinks[1].mute.windows: required: at least one window`}, false},
		{"where", `mute: {windows: [{from: "00:00", to: "24:00"}], where: "object.metadata.name"}`,
			[]string{`config.yaml:13: sinks[1].mute.where: …`}, false},
		{"digest bounds", `digest: {every: 100ms, max: 0, groupBy: "1"}`,
			[]string{`config.yaml:13: sinks[1].digest.every: must be between 1s and 24h0m0s, got 100ms`,
				`config.yaml:13: sinks[1].digest.max: must be between 1 and 1000, got 0`,
				`config.yaml:13: sinks[1].digest.groupBy: must be a string expression, got int`}, false},
		{"a digest needs a body", "digest: {every: 1m}",
			[]string{`config.yaml:12: sinks[1].digest: this webhook sink cannot render a digest: use a webhook with preset slack, teams or generic, or with request.digest (the digest's body)`}, true},
		{"digest with an update window", "digest: {every: 1m}\n    updateWindow: 1m",
			[]string{`config.yaml:13: sinks[1].digest: set either digest or updateWindow: a digest already sends each object at most once per period`}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			preset := "      preset: slack\n"
			if tc.bare {
				preset = ""
			}
			_, _, err := Parse("config.yaml", []byte(mutate(t, base, old, old+preset+"    "+tc.block+"\n")), types)
			var cerr *Error
			if !errors.As(err, &cerr) {
				t.Fatalf("err = %v, want a config error", err)
			}
			var got []string
			for _, p := range cerr.Problems {
				got = append(got, p.Format("config.yaml"))
			}
			if !matchAll(got, tc.want) {
				t.Errorf("problems:\n  %s\nwant:\n  %s", strings.Join(got, "\n  "), strings.Join(tc.want, "\n  "))
			}
		})
	}
}

// Until says whether a time is muted and until when, in each window's own
// zone: across midnight (the window belongs to the day it starts), on the
// listed days only, adjoining windows as one, and through a daylight
// saving change (the wall clock's 07:00, whatever the offset).
func TestMuteScheduleUntil(t *testing.T) {
	m := &Mute{Windows: []MuteWindow{
		{Days: []string{"fri", "sat"}, From: "22:00", To: "07:00", TimeZone: "Europe/Berlin"},
		{Days: []string{"sun"}, From: "00:00", To: "24:00", TimeZone: "Europe/Berlin"},
		{From: "12:00:00", To: "12:00:30", TimeZone: "America/New_York"},
	}}
	s, err := m.Schedule()
	if err != nil {
		t.Fatal(err)
	}
	berlin, _ := time.LoadLocation("Europe/Berlin")
	ny, _ := time.LoadLocation("America/New_York")
	for _, tc := range []struct {
		at   time.Time
		want time.Time // zero: not muted
	}{
		{time.Date(2026, 11, 27, 21, 59, 59, 0, berlin), time.Time{}},                               // Friday, before
		{time.Date(2026, 11, 27, 22, 0, 0, 0, berlin), time.Date(2026, 11, 28, 7, 0, 0, 0, berlin)}, // Friday night
		{time.Date(2026, 11, 28, 6, 59, 0, 0, berlin), time.Date(2026, 11, 28, 7, 0, 0, 0, berlin)},
		{time.Date(2026, 11, 28, 7, 0, 0, 0, berlin), time.Time{}},                                  // Saturday morning: over
		{time.Date(2026, 11, 28, 23, 0, 0, 0, berlin), time.Date(2026, 11, 30, 0, 0, 0, 0, berlin)}, // Saturday night runs into Sunday
		{time.Date(2026, 11, 30, 0, 0, 0, 0, berlin), time.Time{}},                                  // Monday: the Sunday night window is not listed
		{time.Date(2026, 11, 26, 23, 0, 0, 0, berlin), time.Time{}},                                 // Thursday night
		{time.Date(2026, 11, 26, 12, 0, 10, 0, ny), time.Date(2026, 11, 26, 12, 0, 30, 0, ny)},      // seconds, every day
		// 2026-03-28 is a Saturday; clocks go forward at 02:00 on the 29th.
		{time.Date(2026, 3, 28, 23, 0, 0, 0, berlin), time.Date(2026, 3, 30, 0, 0, 0, 0, berlin)},
		{time.Date(2026, 3, 27, 23, 0, 0, 0, berlin), time.Date(2026, 3, 28, 7, 0, 0, 0, berlin)},
	} {
		end, muted := s.Until(tc.at.UTC())
		if muted != !tc.want.IsZero() || (muted && !end.Equal(tc.want)) {
			t.Errorf("Until(%s) = %s, %v; want %s", tc.at, end.In(tc.at.Location()), muted, tc.want)
		}
	}

	// A wall time the spring change skips (02:00 to 03:00 in Berlin on
	// 2026-03-29) is the moment of the change: a window from 02:30 starts
	// at 03:00, not an hour late; one that ends in the gap ends then; one
	// within the gap is empty that day.
	cest := func(h, m int) time.Time { return time.Date(2026, 3, 29, h, m, 0, 0, berlin) }
	for _, tc := range []struct {
		from, to string
		at, want time.Time // want zero: not muted
	}{
		{"02:30", "05:00", cest(1, 59), time.Time{}},
		{"02:30", "05:00", cest(3, 0), cest(5, 0)},
		{"02:30", "05:00", cest(3, 29), cest(5, 0)},
		{"01:00", "02:30", cest(1, 30), cest(3, 0)},
		{"01:00", "02:30", cest(3, 0), time.Time{}},
		{"02:15", "02:45", cest(3, 20), time.Time{}},
		{"02:30", "02:10", time.Date(2026, 3, 28, 23, 0, 0, 0, berlin), time.Date(2026, 3, 30, 2, 10, 0, 0, berlin)}, // adjoining: the 28th's ends at the change, the 29th's starts then
	} {
		s, err := (&Mute{Windows: []MuteWindow{{From: tc.from, To: tc.to, TimeZone: "Europe/Berlin"}}}).Schedule()
		if err != nil {
			t.Fatal(err)
		}
		end, muted := s.Until(tc.at)
		if muted != !tc.want.IsZero() || (muted && !end.Equal(tc.want)) {
			t.Errorf("%s-%s: Until(%s) = %s, %v; want %s", tc.from, tc.to, tc.at, end.In(berlin), muted, tc.want)
		}
	}
}

// A sink that fires and resolves alerts cannot be muted: its replay keeps
// the alerts firing, and held through a window they would expire (resolved
// at night, fired again in the morning). The error points at silencing
// them where they are routed; a chat message sink is muted as before.
func TestMuteIsRefusedOnAnAlertSink(t *testing.T) {
	const old = "      url: https://hooks.example.com/k8s\n"
	const mute = "    replayEvery: 1m\n    mute: {windows: [{from: \"22:00\", to: \"07:00\"}]}\n"
	for _, tc := range []struct {
		name, sink string
		refused    bool
	}{
		{"alertmanager preset", "      url: http://am:9093/api/v2/alerts\n      preset: alertmanager\n", true},
		{"pagerduty preset", old + "      preset: pagerduty\n      credentialFiles: {routingKey: /etc/pd/key}\n", true},
		{"request posting to Alertmanager", "      url: http://am:9093\n      request: {path: \"'/api/v2/alerts'\", body: \"[{'labels': {'alertname': 'x'}}]\"}\n", true},
		{"slack preset", old + "      preset: slack\n", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := Parse("config.yaml", []byte(mutate(t, base, old, tc.sink+mute)), types)
			var cerr *Error
			if err != nil && !errors.As(err, &cerr) {
				t.Fatalf("err = %v, want a config error", err)
			}
			var got []string
			refused := false
			if cerr != nil {
				for _, p := range cerr.Problems {
					f := p.Format("config.yaml")
					got = append(got, f)
					refused = refused || strings.Contains(f, "sinks[1].mute: this webhook sink posts alerts") && strings.Contains(f, "Alertmanager silence")
				}
			}
			if refused != tc.refused {
				t.Errorf("mute refused: %v, want %v; problems:\n  %s", refused, tc.refused, strings.Join(got, "\n  "))
			}
		})
	}
}

// The example's quiet hours cover the whole night from Sunday into Monday:
// a window belongs to the day it starts on, so the weeknights list sun
// (without it, Monday 00:00 to 08:00 was not muted).
func TestExampleQuietHoursCoverSundayNight(t *testing.T) {
	data, err := os.ReadFile("../../config/deployments-digest-with-quiet-hours.yaml")
	if err != nil {
		t.Fatal(err)
	}
	cfg, _, err := Parse("deployments-digest-with-quiet-hours.yaml", data, types)
	if err != nil {
		t.Fatal(err)
	}
	s, err := cfg.Sinks[0].Mute.Schedule()
	if err != nil {
		t.Fatal(err)
	}
	berlin, _ := time.LoadLocation("Europe/Berlin")
	monday8 := time.Date(2026, 11, 30, 8, 0, 0, 0, berlin)
	for _, at := range []time.Time{
		time.Date(2026, 11, 28, 12, 0, 0, 0, berlin), // Saturday noon
		time.Date(2026, 11, 29, 23, 0, 0, 0, berlin), // Sunday night
		time.Date(2026, 11, 30, 3, 0, 0, 0, berlin),  // Monday's small hours
	} {
		if end, muted := s.Until(at); !muted || !end.Equal(monday8) {
			t.Errorf("%s: muted %v until %s; want muted until Monday 08:00", at.Format("Mon 15:04"), muted, end.In(berlin).Format("Mon 15:04"))
		}
	}
	if _, muted := s.Until(monday8); muted {
		t.Error("Monday 08:00: muted")
	}
}

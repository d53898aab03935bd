package config

import (
	"errors"
	"fmt"
	"strings"
	"time"

	// The IANA time zone database in the binary: a mute window names its
	// zone, and the container image may have no /usr/share/zoneinfo.
	_ "time/tzdata"

	"github.com/kubebridge/kubebridge/pkg/internal/celsandbox"
)

// Digest sends a sink's events once per period, one message per group,
// listing what entered the view, what left it and what changed.
type Digest struct {
	// Every is the period: the first event after a digest was sent starts the next one, sent this long after with every event that arrived meanwhile (an object's events coalesced, the latest state winning; one created and deleted within it is not listed). Required, between 1s and 24h.
	Every Duration `yaml:"every"`
	// GroupBy is a CEL string over what a request template sees (object, event, ...), e.g. object.metadata.namespace: one message per value and period; an object it fails on (a label it lacks) is in group "", counted in kubebridge_sink_digest_group_errors_total. Default: one message per period.
	GroupBy string `yaml:"groupBy"`
	// Max is how many objects a message lists (1 to 1000); the rest are counted ("… and 12 more") and delivered with it, not listed. Default 50.
	Max int `yaml:"max"`
}

// DefaultDigestMax is how many objects a digest lists by default.
const DefaultDigestMax = 50

// SetDefaults lists 50 objects per message.
func (d *Digest) SetDefaults() { d.Max = DefaultDigestMax }

// Bounds of a digest.
const (
	minDigestEvery = time.Second
	maxDigestEvery = 24 * time.Hour
	maxDigestMax   = 1000
)

// Validate checks the period, the list's bound and the group expression.
func (d *Digest) Validate() error {
	var errs []error
	if d.Every.D() < minDigestEvery || d.Every.D() > maxDigestEvery {
		errs = append(errs, ErrorAt("every", "must be between %s and %s, got %s", minDigestEvery, maxDigestEvery, d.Every))
	}
	if d.Max < 1 || d.Max > maxDigestMax {
		errs = append(errs, ErrorAt("max", "must be between 1 and %d, got %d", maxDigestMax, d.Max))
	}
	if d.GroupBy != "" {
		if len(d.GroupBy) > maxWhereExprBytes {
			errs = append(errs, ErrorAt("groupBy", "expression is %d bytes, more than %d", len(d.GroupBy), maxWhereExprBytes))
		} else if _, cerrs := celsandbox.CompileTemplate(d.GroupBy, "string"); len(cerrs) > 0 {
			for _, e := range cerrs {
				errs = append(errs, ErrorAt("groupBy", "%v", e))
			}
		}
	}
	return errors.Join(errs...)
}

// Mute holds a sink's events during time windows (quiet hours): each
// object's are coalesced (the latest state wins), and what is still true
// when the window ends is sent, as a digest where the sink has one. Nothing
// is dropped: an object created and deleted within a window sends nothing,
// as the view never held it when the window ended.
type Mute struct {
	// Windows are when the sink is muted; overlapping or adjoining windows make one. Required.
	Windows []MuteWindow `yaml:"windows"`
	// Where is a CEL bool over what a rule's where sees (object, oldObject, type): only the events it is true for are held, and those it fails on (a label the object lacks), counted in kubebridge_sink_mute_where_errors_total. Default: every event.
	Where string `yaml:"where"`
}

// MuteWindow is a daily time window, on some days of the week, in a time
// zone.
type MuteWindow struct {
	// Days the window starts on: mon, tue, wed, thu, fri, sat, sun. Default: every day.
	Days []string `yaml:"days"`
	// From is when the window starts, HH:MM or HH:MM:SS, in timeZone. Required.
	From string `yaml:"from"`
	// To is when it ends, HH:MM or HH:MM:SS (24:00: midnight); earlier than from, it ends the next day (22:00 to 07:00). Required, not equal to from.
	To string `yaml:"to"`
	// TimeZone is an IANA time zone name (Europe/Berlin; the database is built into the binary). Default UTC.
	TimeZone string `yaml:"timeZone"`
}

// Validate checks that the mute has windows and that where compiles.
func (m *Mute) Validate() error {
	var errs []error
	if len(m.Windows) == 0 {
		errs = append(errs, ErrorAt("windows", "required: at least one window"))
	}
	if m.Where != "" {
		if len(m.Where) > maxWhereExprBytes {
			errs = append(errs, ErrorAt("where", "expression is %d bytes, more than %d", len(m.Where), maxWhereExprBytes))
		} else if _, cerrs := celsandbox.CompileWhere(m.Where); len(cerrs) > 0 {
			for _, e := range cerrs {
				errs = append(errs, ErrorAt("where", "%v", e))
			}
		}
	}
	return errors.Join(errs...)
}

// Validate parses the window, naming the key that does not parse.
func (w *MuteWindow) Validate() error {
	_, err := w.parse()
	return err
}

// MuteSchedule is a mute's windows, parsed.
type MuteSchedule []muteSpan

type muteSpan struct {
	days     [7]bool // by time.Weekday
	from, to time.Duration
	loc      *time.Location
}

// Schedule parses the mute's windows (Validate's errors).
func (m *Mute) Schedule() (MuteSchedule, error) {
	var out MuteSchedule
	var errs []error
	for i := range m.Windows {
		s, err := m.Windows[i].parse()
		if err != nil {
			errs = append(errs, fmt.Errorf("windows[%d].%w", i, err))
			continue
		}
		out = append(out, s)
	}
	return out, errors.Join(errs...)
}

var weekdays = map[string]time.Weekday{"sun": time.Sunday, "mon": time.Monday, "tue": time.Tuesday, "wed": time.Wednesday,
	"thu": time.Thursday, "fri": time.Friday, "sat": time.Saturday}

func (w *MuteWindow) parse() (muteSpan, error) {
	var s muteSpan
	var errs []error
	if len(w.Days) == 0 {
		s.days = [7]bool{true, true, true, true, true, true, true}
	}
	for i, d := range w.Days {
		wd, ok := weekdays[strings.ToLower(d)]
		if !ok {
			errs = append(errs, ErrorAt(fmt.Sprintf("days[%d]", i), "unknown day %q: write mon, tue, wed, thu, fri, sat or sun", d))
			continue
		}
		s.days[wd] = true
	}
	from, errFrom := clockTime(w.From, false)
	to, errTo := clockTime(w.To, true)
	s.from, s.to = from, to
	for _, e := range []struct {
		key string
		err error
	}{{"from", errFrom}, {"to", errTo}} {
		if e.err != nil {
			errs = append(errs, ErrorAt(e.key, "%v", e.err))
		}
	}
	if errFrom == nil && errTo == nil && from == to {
		errs = append(errs, ErrorAt("to", "equals from: the window is empty (a whole day is from 00:00 to 24:00)"))
	}
	tz := w.TimeZone
	if tz == "" {
		tz = "UTC"
	}
	var err error
	if s.loc, err = time.LoadLocation(tz); err != nil || strings.EqualFold(tz, "local") {
		errs = append(errs, ErrorAt("timeZone", "unknown time zone %q (an IANA name, e.g. Europe/Berlin or UTC)", w.TimeZone))
	}
	return s, errors.Join(errs...)
}

// clockTime parses HH:MM or HH:MM:SS into the time since midnight; 24:00
// only where end allows it.
func clockTime(v string, end bool) (time.Duration, error) {
	if v == "" {
		return 0, errors.New("required: HH:MM or HH:MM:SS")
	}
	var parts [3]int
	fields := strings.Split(v, ":")
	ok := len(fields) == 2 || len(fields) == 3
	for i, f := range fields {
		if !ok || i >= len(parts) || len(f) != 2 || f[0] < '0' || f[0] > '9' || f[1] < '0' || f[1] > '9' {
			ok = false
			break
		}
		parts[i] = int(f[0]-'0')*10 + int(f[1]-'0')
	}
	h, m, sec := parts[0], parts[1], parts[2]
	ok = ok && m < 60 && sec < 60 && (h < 24 || (end && h == 24 && m == 0 && sec == 0))
	if !ok {
		latest := "23:59:59"
		if end {
			latest = "24:00"
		}
		return 0, fmt.Errorf("%q is not a time of day: write HH:MM or HH:MM:SS, 00:00 to %s", v, latest)
	}
	return time.Duration(h)*time.Hour + time.Duration(m)*time.Minute + time.Duration(sec)*time.Second, nil
}

// maxChained bounds how many adjoining windows Until follows (a week of
// daily windows, twice over).
const maxChained = 16

// Until reports whether t is in a window and, if so, when the windows
// covering it end (adjoining and overlapping windows are one).
func (s MuteSchedule) Until(t time.Time) (end time.Time, muted bool) {
	for range maxChained {
		e, ok := s.covering(t)
		if !ok {
			break
		}
		end, muted, t = e, true, e
	}
	return end, muted
}

// covering returns the latest end of the windows that hold t.
func (s MuteSchedule) covering(t time.Time) (end time.Time, ok bool) {
	for _, w := range s {
		lt := t.In(w.loc)
		y, mo, d := lt.Date()
		for back := 0; back <= 1; back++ { // a window that began today, or yesterday and crosses midnight
			day := time.Date(y, mo, d-back, 0, 0, 0, 0, w.loc)
			if !w.days[day.Weekday()] {
				continue
			}
			start, stop := at(day, w.from, w.loc), at(day, w.to, w.loc)
			if w.to < w.from {
				stop = at(day.AddDate(0, 0, 1), w.to, w.loc)
			}
			if !t.Before(start) && t.Before(stop) && stop.After(end) {
				end, ok = stop, true
			}
		}
	}
	return end, ok
}

// at is the time of day since (24:00: the next midnight) on day's date in
// loc, as a wall clock shows it. A time a daylight-saving change skips is
// the moment of the change, when the clock passes it (time.Date would move
// it past the gap by the gap's length: 02:30 to 03:30, a window an hour
// late).
func at(day time.Time, since time.Duration, loc *time.Location) time.Time {
	y, mo, d := day.Date()
	h, m, s := int(since/time.Hour), int(since%time.Hour/time.Minute), int(since%time.Minute/time.Second)
	t := time.Date(y, mo, d, h, m, s, 0, loc)
	want := time.Date(y, mo, d, h, m, s, 0, time.UTC)
	shown := time.Date(t.Year(), t.Month(), t.Day(), t.Hour(), t.Minute(), t.Second(), 0, time.UTC)
	switch start, end := t.ZoneBounds(); {
	case shown.After(want) && !start.IsZero(): // moved past the gap
		return start
	case shown.Before(want) && !end.IsZero(): // kept before it
		return end
	}
	return t
}

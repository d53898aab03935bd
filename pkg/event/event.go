// Package event defines the CloudEvents 1.0 envelope kubebridge delivers
// and how it is built from an informer notification.
//
// Ids are unique per transition and stable across replays of it:
// <uid>.<tag>.<resourceVersion>.<type>, where tag is a hash of the rule and
// the incarnation's stamp: the moment the object (this incarnation) entered
// the rule's view, or when a checkpoint's incarnation was first sent again
// (see docs/guarantees.md). So two rules, a re-entry into the view with the
// object unchanged and a re-created object all get distinct ids, while the
// same transition sent again (a retry, a replay after a restart: the stamp
// is in the checkpoint) keeps its id and consumers (and JetStream) can
// dedupe. An Event is immutable once built and shared by every sink it goes to; its
// data (object, oldObject, RFC 6902 patch) is rendered lazily, on the sink's
// worker, never on the informer's goroutine.
package event

import (
	"encoding/json"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/wI2L/jsondiff"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/kubebridge/kubebridge/pkg/fieldpath"
)

// Change is the kind of change (added, updated, deleted): what a consumer
// mirroring a rule's view does. Not to be confused with Event.Type, the
// CloudEvents type string that ends with it.
type Change string

// The changes a rule delivers (the events: list of the config).
const (
	Added   Change = "added"
	Updated Change = "updated"
	Deleted Change = "deleted"
)

// Values of the kbreplay and kbreason extensions (kbchange's are the
// Changes).
const (
	ReplayResync     = "resync"
	ReplayCheckpoint = "checkpoint"
	ReasonUnmatched  = "unmatched" // the object left the rule's view; it still exists
)

// SpecVersion is the CloudEvents version of the envelope.
const SpecVersion = "1.0"

// Rule is what an event needs to know of the rule that produced it.
type Rule struct {
	Name          string
	Cluster       string
	GVR           schema.GroupVersionResource
	IncludeObject bool
	IncludeOld    bool
	IncludePatch  bool
	IncludeMeta   bool // the object's apiVersion, kind and metadata only
	// IncludeOwners: data carries the owner chain (and, for a Kubernetes
	// Event, the involved object) the rules stage resolved (Related).
	IncludeOwners bool
	// AllowSecretData: the rule's events may carry Secret data; set only
	// when both the rule and the operator allow it (AllowsSecretData).
	AllowSecretData bool
	// SecretAnnotations are the Secret annotations redacted with the data
	// (event.AllAnnotations: every one).
	SecretAnnotations []string
	// Changed are the rule's changed paths: what Changes reports on (none:
	// the whole object).
	Changed []fieldpath.Path
	// Kind is the kind of the rule's resource (discovery's), when the one
	// who builds the rule knows it. Default "": the kind of an object of
	// the resource seen (Learn), else Kubernetes' built-in kind of the
	// resource (see ResourceKind).
	Kind string

	// learned is the kind Learn read from an object of the resource.
	learned atomic.Pointer[string]

	// names holds the attributes every event of the rule repeats (source,
	// types), built on first use rather than per event.
	names atomic.Pointer[ruleNames]
	// dataSize is the size of the last event data rendered: the next
	// one's buffer starts that large (objects of a rule are alike).
	dataSize atomic.Int64
}

// sizeHint is the buffer an event's data starts with.
func (r *Rule) sizeHint() int { return int(min(max(r.dataSize.Load()+64, 256), 1<<20)) }

// Secrets is the rule's SecretPolicy: what its filters see and its events
// carry of Secret values.
func (r *Rule) Secrets() SecretPolicy {
	return SecretPolicy{redacts: IsSecret(r.GVR) && !r.AllowSecretData, annotations: r.SecretAnnotations}
}

// ruleNames are the attributes a rule's events share, and what they were
// built from (a Rule is not modified once events are built, but a stale
// cache must never be used if one were).
type ruleNames struct {
	cluster, resource, group string
	source                   string
	types                    [3]string // Added, Updated, Deleted
}

// eventNames returns the rule's shared attributes.
func (r *Rule) eventNames() *ruleNames {
	n := r.names.Load()
	if n != nil && n.cluster == r.Cluster && n.resource == r.GVR.Resource && n.group == r.GVR.Group {
		return n
	}
	n = &ruleNames{cluster: r.Cluster, resource: r.GVR.Resource, group: r.GVR.Group, source: "kubebridge/" + r.Cluster}
	for i, c := range [3]Change{Added, Updated, Deleted} {
		n.types[i] = typeOf(r.GVR, c)
	}
	r.names.Store(n)
	return n
}

// typeOf is the CloudEvents type of a change of a resource.
func typeOf(gvr schema.GroupVersionResource, c Change) string {
	group := gvr.Group
	if group == "" {
		group = "core"
	}
	return "io.kubebridge." + gvr.Resource + "." + group + "." + string(c)
}

// eventType is the CloudEvents type of change c under the rule.
func (n *ruleNames) eventType(gvr schema.GroupVersionResource, c Change) string {
	switch c {
	case Added:
		return n.types[0]
	case Updated:
		return n.types[1]
	case Deleted:
		return n.types[2]
	}
	return typeOf(gvr, c)
}

// Event is one CloudEvent. Build it with Build (or New).
//
// What every event of a rule repeats (Source, Type, Rule, Cluster, GVR),
// what is derived from other fields (Namespace and Name from Subject; Key,
// QueueKey and UID) and the object's Kind are methods, not stored: an
// event is built once per transition and sink on the informer's path,
// and its size is most of what that path allocates.
type Event struct {
	ID      string
	Subject string // <namespace>/<name>, or <name> for cluster-scoped objects
	Time    time.Time

	// Extensions (with Rule and Cluster).
	Replay string // kbreplay: "", resync or checkpoint
	Reason string // kbreason: "" or unmatched

	// Routing facts, not attributes of their own (with GVR, Kind,
	// Namespace, Name and UID).
	Change Change
	// keys is QueueKey: Key, a 0 byte, then UID.
	keys string
	// Entered is when this incarnation of the object (UID) entered the
	// rule's view, in unix nanoseconds: a request's for and event.entered
	// read it. Recorded in the checkpoint, it is the object's, kept across
	// restarts, reloads and handovers.
	Entered int64
	// Stamp is what the id's tag hashes of the incarnation (unix
	// nanoseconds): Entered, unless the incarnation was loaded from a
	// checkpoint, which may lag what the consumer got, and sent since; it
	// then got a new stamp so that its ids cannot repeat one sent before
	// (docs/guarantees.md). Recorded in the checkpoint, so that a replay of
	// the transition gets the same id.
	Stamp int64
	// Quiet marks a transition the rule does not deliver (its events,
	// changed or where leave it out): it goes through the sink's queue in
	// order and is recorded in the checkpoint as acknowledged, but is never
	// sent. The view a sink is recorded to hold includes it either way.
	Quiet bool
	// Fresh marks an added of an object the sink was never handed any state
	// of: if it is never attempted, it can vanish together with the
	// object's deletion without the consumer or the checkpoint missing
	// anything, since the object was in neither the acknowledged view nor
	// the desired one. Quiet adds are fresh too (a rule that sends only
	// deletions reports the deletions of objects its sink held, not of
	// every object created and deleted while the sink was away). Queues use
	// it so that a sink outage with create/delete churn holds memory per
	// live object, not per name churned, whatever the rule's events.
	Fresh bool

	rule      *Rule
	object    *unstructured.Unstructured
	oldObject *unstructured.Unstructured
	related   *Related // with the rule's IncludeOwners; nil: not resolved

	// lazy is what rendering the event computes, made on first use: most
	// events on the informer's path are never rendered (quiet ones, sinks
	// that do not encode), and an Event stays small without it.
	lazy atomic.Pointer[rendered]
}

// rendered is an event's data and structured encoding, each computed once.
type rendered struct {
	dataOnce sync.Once
	data     json.RawMessage
	dataErr  error

	encOnce sync.Once
	enc     []byte
	encErr  error
}

// rendered returns e's rendering state, making it on first use.
func (e *Event) rendered() *rendered {
	if r := e.lazy.Load(); r != nil {
		return r
	}
	r := &rendered{}
	if e.lazy.CompareAndSwap(nil, r) {
		return r
	}
	return e.lazy.Load()
}

// The methods below derive what an event does not store; on an Event not
// made by Build (the zero Event) they return zero values.

// Source is the CloudEvents source: kubebridge/<cluster>.
func (e *Event) Source() string {
	if e.rule == nil {
		return ""
	}
	return e.rule.eventNames().source
}

// Type is the CloudEvents type:
// io.kubebridge.<resource>.<group or core>.<added|updated|deleted>.
func (e *Event) Type() string {
	if e.rule == nil {
		return ""
	}
	return e.rule.eventNames().eventType(e.rule.GVR, e.Change)
}

// Rule is the name of the rule the event is of (kbrule).
func (e *Event) Rule() string {
	if e.rule == nil {
		return ""
	}
	return e.rule.Name
}

// Cluster is the cluster's name (kbcluster).
func (e *Event) Cluster() string {
	if e.rule == nil {
		return ""
	}
	return e.rule.Cluster
}

// GVR is the resource of the event's object.
func (e *Event) GVR() schema.GroupVersionResource {
	if e.rule == nil {
		return schema.GroupVersionResource{}
	}
	return e.rule.GVR
}

// Key identifies the object within its rule: <rule>/<namespace>/<name>.
// Queues keep order per Key, and a sink never has two events of one Key in
// flight.
func (e *Event) Key() string {
	if i := strings.LastIndexByte(e.keys, 0); i >= 0 {
		return e.keys[:i]
	}
	return ""
}

// UID is the object's uid. (It shares the queue key's memory: what keeps
// it for long copies it, or reads the object's.)
func (e *Event) UID() string {
	if i := strings.LastIndexByte(e.keys, 0); i >= 0 {
		return e.keys[i+1:]
	}
	return ""
}

// Namespace is the object's namespace, "" for a cluster-scoped one: the
// Subject up to its "/" (object names never contain one).
func (e *Event) Namespace() string {
	if i := strings.IndexByte(e.Subject, '/'); i >= 0 {
		return e.Subject[:i]
	}
	return ""
}

// Name is the object's name: the Subject after its "/", if any.
func (e *Event) Name() string { return e.Subject[strings.IndexByte(e.Subject, '/')+1:] }

// Kind is the object's kind; for an object that does not carry one (rebuilt
// from a checkpoint: metadata only), its resource's (Rule.ResourceKind).
func (e *Event) Kind() string {
	if e.object != nil {
		if k, _ := e.object.Object["kind"].(string); k != "" {
			return k
		}
	}
	if e.rule == nil {
		return ""
	}
	return e.rule.ResourceKind()
}

// QueueKey is Key and UID: queues coalesce by it, so that a replaced
// object's deletion is never merged into its successor's addition.
func (e *Event) QueueKey() string { return e.keys }

// Transition is one change of an object in a rule's view, as one sink is
// to receive it.
type Transition struct {
	Change      Change
	Object, Old *unstructured.Unstructured // Old: the state the sink saw before, for updates
	Time        time.Time                  // when the bridge observed the change
	Entered     int64                      // see Event.Entered
	Stamp       int64                      // see Event.Stamp; 0: Entered
	Replay      string                     // kbreplay
	Reason      string                     // kbreason
	Quiet       bool                       // see Event.Quiet
	Fresh       bool                       // see Event.Fresh (added only)
	// Subject, when the caller has it, is Object's <namespace>/<name> (or
	// <name>), the object key: Build uses it as the event's Subject
	// rather than building that string again. One that does not name
	// Object is ignored.
	Subject string
	// Meta, when the caller has read it, is Object's (MetaOf): Build takes
	// it rather than reading the object's maps again. Zero: Build reads it
	// (a zero Meta is also what reading an object without metadata gives).
	Meta Meta
	// Related is Object's owners and involved object, for a rule that
	// includes owners (nil: not resolved, e.g. a deletion found in a
	// checkpoint at a start).
	Related *Related
}

// Meta is what an event takes from its object's metadata: what names it
// and its version. The informer's handler reads it once per notification
// and hands it down (Transition.Meta), since reading an unstructured
// object's fields is a map lookup each.
type Meta struct {
	Namespace, Name, UID, ResourceVersion string
}

// MetaOf reads u's Meta.
func MetaOf(u *unstructured.Unstructured) Meta {
	md, _ := u.Object["metadata"].(map[string]any)
	return MetaFrom(md)
}

// MetaFrom is MetaOf for a caller that holds the object's metadata map.
func MetaFrom(md map[string]any) Meta {
	var m Meta
	m.Namespace, _ = md["namespace"].(string)
	m.Name, _ = md["name"].(string)
	m.UID, _ = md["uid"].(string)
	m.ResourceVersion, _ = md["resourceVersion"].(string)
	return m
}

// New builds the event for a change of obj (old is the previous state, for
// updates) under rule r, observed at now, for an object that entered the
// view at now.
func New(r *Rule, change Change, obj, old *unstructured.Unstructured, now time.Time) *Event {
	return Build(r, Transition{Change: change, Object: obj, Old: old, Time: now, Entered: now.UnixNano()})
}

// Build builds the event of transition t under rule r. t.Object must not be
// modified afterwards: informer cache objects never are.
//
// It is on the informer's path once per transition and sink: it reads the
// object's metadata map once, takes the rule's shared attributes from
// the rule, the Subject from t.Subject when set, and puts the id and the
// queue key in one allocation.
func Build(r *Rule, t Transition) *Event {
	obj := t.Object
	m := t.Meta
	if m == (Meta{}) {
		m = MetaOf(obj)
	}
	ns, name, uid, rv := m.Namespace, m.Name, m.UID, m.ResourceVersion
	subject := t.Subject
	if !isSubject(subject, ns, name) {
		subject = name
		if ns != "" {
			subject = ns + "/" + name
		}
	}
	// The id, then the queue key (Key, then the uid): one allocation.
	b := make([]byte, 0, idLen(uid, rv, t.Change)+len(r.Name)+1+len(subject)+1+len(uid))
	stamp := t.Stamp
	if stamp == 0 {
		stamp = t.Entered
	}
	b = appendID(b, r.Name, uid, rv, t.Change, stamp, t.Reason)
	n := len(b)
	b = append(b, r.Name...)
	b = append(b, '/')
	b = append(b, subject...)
	b = append(b, 0)
	b = append(b, uid...)
	all := unsafe.String(unsafe.SliceData(b), len(b))
	queueKey := all[n:]
	return &Event{
		ID:        all[:n],
		Subject:   subject,
		Time:      t.Time.UTC(),
		Replay:    t.Replay,
		Reason:    t.Reason,
		Change:    t.Change,
		keys:      queueKey,
		Entered:   t.Entered,
		Stamp:     stamp,
		Quiet:     t.Quiet,
		Fresh:     t.Fresh && t.Change == Added,
		rule:      r,
		object:    obj,
		oldObject: t.Old,
		related:   t.Related,
	}
}

// isSubject reports whether s is <ns>/<name>, or <name> when ns is empty.
func isSubject(s, ns, name string) bool {
	if ns == "" {
		return s == name && s != ""
	}
	return len(s) == len(ns)+1+len(name) && s[len(ns)] == '/' && s[:len(ns)] == ns && s[len(ns)+1:] == name
}

// ID is the id of a transition: <uid>.<tag>.<resourceVersion>.<type>, tag
// being 12 hex digits of FNV-1a over the rule name, the incarnation's
// stamp (Event.Stamp) and the kbreason (when set). The
// uid, resourceVersion and type stay readable for people and for
// consumers that parse them; the tag separates rules and incarnations.
func ID(rule, uid, rv string, change Change, stamp int64, reason string) string {
	b := appendID(make([]byte, 0, idLen(uid, rv, change)), rule, uid, rv, change, stamp, reason)
	return unsafe.String(unsafe.SliceData(b), len(b))
}

// idLen is the length of an id.
func idLen(uid, rv string, change Change) int { return len(uid) + len(rv) + len(change) + 15 }

// appendID appends the id of a transition (see ID) to b. It runs once per
// event on the informer's path, so it hashes the stamp's decimal digits
// without formatting them first.
func appendID(b []byte, rule, uid, rv string, change Change, stamp int64, reason string) []byte {
	h := uint64(fnvOffset)
	for i := 0; i < len(rule); i++ {
		h = (h ^ uint64(rule[i])) * fnvPrime
	}
	h *= fnvPrime // the 0 separator
	// The decimal digits of stamp, as strconv.FormatInt writes them, two
	// at a time.
	var num [20]byte
	i := len(num)
	u := uint64(stamp)
	if stamp < 0 {
		u = -u
	}
	for u >= 100 {
		q := u / 100
		d := (u - q*100) * 2
		i -= 2
		num[i], num[i+1] = digitPairs[d], digitPairs[d+1]
		u = q
	}
	if u >= 10 {
		i -= 2
		num[i], num[i+1] = digitPairs[u*2], digitPairs[u*2+1]
	} else {
		i--
		num[i] = byte('0' + u)
	}
	if stamp < 0 {
		h = (h ^ '-') * fnvPrime
	}
	for _, c := range num[i:] {
		h = (h ^ uint64(c)) * fnvPrime
	}
	if reason != "" {
		h *= fnvPrime
		for i := 0; i < len(reason); i++ {
			h = (h ^ uint64(reason[i])) * fnvPrime
		}
	}
	b = append(b, uid...)
	const hex = "0123456789abcdef"
	b = append(b, '.',
		hex[(h>>44)&15], hex[(h>>40)&15], hex[(h>>36)&15], hex[(h>>32)&15], hex[(h>>28)&15], hex[(h>>24)&15],
		hex[(h>>20)&15], hex[(h>>16)&15], hex[(h>>12)&15], hex[(h>>8)&15], hex[(h>>4)&15], hex[h&15], '.')
	b = append(b, rv...)
	b = append(b, '.')
	return append(b, change...)
}

// digitPairs are "00" to "99".
const digitPairs = "00010203040506070809101112131415161718192021222324252627282930313233343536373839404142434445464748495051525354555657585960616263646566676869707172737475767778798081828384858687888990919293949596979899"

// FNV-1a, 64 bits (hash/fnv), over the id's tag input.
const fnvOffset, fnvPrime = 14695981039346656037, 1099511628211

// WithReplay returns a copy of e marked as a replay (kbreplay).
func (e *Event) WithReplay(replay string) *Event {
	c := e.clone()
	c.Replay = replay
	return c
}

// WithFresh returns a copy of e with Fresh set to fresh (see Fresh).
func (e *Event) WithFresh(fresh bool) *Event {
	c := e.clone()
	c.Fresh = fresh
	return c
}

// WithoutData returns a copy of e whose data is null: its envelope, for a
// dead-letter that refuses the whole event (too large, unencodable).
func (e *Event) WithoutData() *Event {
	c := e.clone()
	r := c.rendered()
	r.dataOnce.Do(func() { r.data = json.RawMessage("null") })
	return c
}

// WithQuiet returns a copy of e with Quiet set to quiet.
func (e *Event) WithQuiet(quiet bool) *Event {
	c := e.clone()
	c.Quiet = quiet
	return c
}

func (e *Event) clone() *Event {
	return &Event{
		ID: e.ID, Subject: e.Subject, Time: e.Time, Replay: e.Replay, Reason: e.Reason,
		Change: e.Change, keys: e.keys,
		Entered: e.Entered, Stamp: e.Stamp, Quiet: e.Quiet, Fresh: e.Fresh, rule: e.rule, object: e.object, oldObject: e.oldObject,
		related: e.related,
	}
}

// OldObject returns the state the sink saw before an update (nil if unknown).
func (e *Event) OldObject() *unstructured.Unstructured { return e.oldObject }

// Related returns the owners and involved object resolved for the event's
// object: nil unless the rule includes owners and they were resolved.
// Callers must not modify it.
func (e *Event) Related() *Related { return e.related }

// RuleInfo returns the rule the event was built for.
func (e *Event) RuleInfo() *Rule { return e.rule }

// Object returns the object the event is about (its last state for deletes).
// Callers must not modify it.
func (e *Event) Object() *unstructured.Unstructured { return e.object }

// Data returns the event's data, {"object":…, "oldObject":…, "patch":[…],
// "owners":[…], "ownersIncomplete":true, "involved":{…}} as the rule's
// include says (docs/consumers.md), with Secret values redacted unless the rule
// allows them. The object and oldObject always carry apiVersion and kind,
// also when the state an event has of its object is only the metadata a
// checkpoint kept (a deletion found at a restart). It is computed once,
// on first use.
func (e *Event) Data() (json.RawMessage, error) {
	r := e.rendered()
	r.dataOnce.Do(func() { r.data, r.dataErr = e.renderData() })
	return r.data, r.dataErr
}

type data struct {
	Object    map[string]any       `json:"object,omitempty"`
	OldObject map[string]any       `json:"oldObject,omitempty"`
	Patch     []jsondiff.Operation `json:"patch,omitempty"`
}

// renderData encodes the payload (appendData).
func (e *Event) renderData() (json.RawMessage, error) {
	b, err := e.appendData(make([]byte, 0, e.rule.sizeHint()))
	if err != nil {
		return nil, err
	}
	return b, nil
}

// appendData appends the payload as json.Marshal encodes data (the fields
// in order, empty ones left out), without reflection (appendJSON).
func (e *Event) appendData(b []byte) ([]byte, error) {
	d, err := e.payload()
	if err != nil {
		return b, err
	}
	start := len(b)
	b = append(b, '{')
	if len(d.Object) > 0 {
		b = append(b, `"object":`...)
		if b, err = appendJSON(b, d.Object, 0); err != nil {
			return b, err
		}
	}
	if len(d.OldObject) > 0 {
		if len(b) > start+1 {
			b = append(b, ',')
		}
		b = append(b, `"oldObject":`...)
		if b, err = appendJSON(b, d.OldObject, 0); err != nil {
			return b, err
		}
	}
	if len(d.Patch) > 0 {
		if len(b) > start+1 {
			b = append(b, ',')
		}
		b = append(b, `"patch":`...)
		if b, err = appendMarshal(b, d.Patch); err != nil {
			return b, err
		}
	}
	if e.rule.IncludeOwners {
		rel := e.related
		if rel == nil {
			rel = &Related{Incomplete: true} // not resolved: said, not guessed
		}
		if b, err = appendRelated(b, rel, len(b) > start+1); err != nil {
			return b, err
		}
	}
	b = append(b, '}')
	e.rule.dataSize.Store(int64(len(b) - start))
	return b, nil
}

// Payload is what the event's data carries, as values: the object (or its
// metadata) and the previous state as the rule includes them, each with
// its apiVersion and kind (see Rule.ResourceKind), redacted as
// the data is, and for updates the JSON patch as a list of
// {"op", "path", "value"} maps. Request templates read it; it must not be
// modified.
func (e *Event) Payload() (object, oldObject map[string]any, patch []any, err error) {
	d, err := e.payload()
	if err != nil {
		return nil, nil, nil, err
	}
	if d.Patch != nil {
		patch = make([]any, len(d.Patch))
		for i, op := range d.Patch {
			m := map[string]any{"op": op.Type, "path": op.Path}
			if op.Value != nil {
				m["value"] = op.Value
			}
			if op.From != "" {
				m["from"] = op.From
			}
			patch[i] = m
		}
	}
	return d.Object, d.OldObject, patch, nil
}

func (e *Event) payload() (data, error) {
	r := e.rule
	secrets := r.Secrets()
	var d data
	if r.IncludeMeta && e.object != nil {
		d.Object = secrets.Redact(MetadataOnly(r.typed(e.object.Object)))
	}
	if r.IncludeObject && e.object != nil {
		d.Object = secrets.Redact(r.typed(e.object.Object))
	}
	if r.IncludeOld && e.oldObject != nil {
		d.OldObject = secrets.Redact(r.typed(e.oldObject.Object))
	}
	if r.IncludePatch && e.Change == Updated && e.oldObject != nil && e.object != nil {
		p, err := jsondiff.Compare(e.oldObject.Object, e.object.Object)
		if err != nil {
			return data{}, err
		}
		d.Patch = secrets.RedactPatch(p)
		if d.Patch == nil {
			d.Patch = []jsondiff.Operation{}
		}
	}
	return d, nil
}

// Attributes calls f with each CloudEvents context attribute of e, in a
// fixed order: specversion, id, source, type, subject, time, kbrule,
// kbcluster, kbchange (added, updated or deleted: the change as an
// attribute of its own, so consumers need not parse the end of type), then
// kbreplay and kbreason when set (datacontenttype and data are the
// encoding's). It is the one mapping from an event to its
// attributes: the structured JSON, the webhook's ce-* headers and the NATS
// headers all come from it.
func (e *Event) Attributes(f func(name, value string)) {
	f("specversion", SpecVersion)
	f("id", e.ID)
	f("source", e.Source())
	f("type", e.Type())
	f("subject", e.Subject)
	f("time", e.Time.Format(time.RFC3339Nano))
	f("kbrule", e.Rule())
	f("kbcluster", e.Cluster())
	f("kbchange", string(e.Change))
	if e.Replay != "" {
		f("kbreplay", e.Replay)
	}
	if e.Reason != "" {
		f("kbreason", e.Reason)
	}
}

// MarshalJSON renders the event in CloudEvents structured JSON mode.
func (e *Event) MarshalJSON() ([]byte, error) { return e.Structured() }

// Structured returns the event in CloudEvents structured JSON mode. It is
// encoded once, on first use, and shared by every sink the event goes to;
// callers must not modify the bytes. Its data, when not rendered yet, is
// rendered in place: Data then shares its bytes.
func (e *Event) Structured() ([]byte, error) {
	r := e.rendered()
	r.encOnce.Do(func() {
		b := make([]byte, 0, e.rule.sizeHint()+400)
		b = append(b, '{')
		e.Attributes(func(name, value string) {
			b = appendString(b, name)
			b = append(b, ':')
			b = appendString(b, value)
			b = append(b, ',')
		})
		b = append(b, `"datacontenttype":"application/json"`...)
		b = append(b, `,"data":`...)
		inPlace, start := false, 0
		r.dataOnce.Do(func() {
			start = len(b)
			if b, r.dataErr = e.appendData(b); r.dataErr == nil {
				r.data = b[start:len(b):len(b)]
			}
			inPlace = true
		})
		if r.dataErr != nil {
			r.encErr = r.dataErr
			return
		}
		if !inPlace {
			b = append(b, r.data...)
		}
		r.enc = append(b, '}')
		if cap(r.enc) > 2*len(r.enc)+4096 {
			// Sized by the rule's last event, far larger than this one: an
			// event is kept while queued or parked, its bytes with it.
			exact := append(make([]byte, 0, len(r.enc)), r.enc...)
			if inPlace {
				r.data = exact[start : start+len(r.data) : start+len(r.data)]
			}
			r.enc = exact
		}
	})
	return r.enc, r.encErr
}

// appendString appends s as a JSON string.
func appendString(b []byte, s string) []byte {
	const hex = "0123456789abcdef"
	b = append(b, '"')
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '"' || c == '\\':
			b = append(b, '\\', c)
		case c < 0x20:
			b = append(b, '\\', 'u', '0', '0', hex[c>>4], hex[c&15])
		default:
			b = append(b, c)
		}
	}
	return append(b, '"')
}

// MetadataOnly returns the apiVersion, kind and metadata of obj (without
// managedFields), sharing obj's values. The input is not modified.
func MetadataOnly(obj map[string]any) map[string]any {
	out := make(map[string]any, 3)
	for _, k := range []string{"apiVersion", "kind"} {
		if v, ok := obj[k]; ok {
			out[k] = v
		}
	}
	if md, ok := obj["metadata"].(map[string]any); ok {
		if _, has := md["managedFields"]; has {
			c := make(map[string]any, len(md))
			for k, v := range md {
				if k != "managedFields" {
					c[k] = v
				}
			}
			md = c
		}
		out["metadata"] = md
	}
	return out
}

// PercentEncode encodes an attribute value for a ce-* header (webhook
// binary mode, NATS headers) as the CloudEvents HTTP binding requires: bytes outside printable ASCII
// (0x21-0x7E), space, '"' and '%' become %XX; UTF-8 is encoded byte-wise.
func PercentEncode(v string) string {
	i := 0
	for i < len(v) && !pctEscaped(v[i]) {
		i++
	}
	if i == len(v) {
		return v
	}
	const hex = "0123456789ABCDEF"
	b := make([]byte, 0, len(v)+16)
	b = append(b, v[:i]...)
	for ; i < len(v); i++ {
		if c := v[i]; pctEscaped(c) {
			b = append(b, '%', hex[c>>4], hex[c&15])
		} else {
			b = append(b, c)
		}
	}
	return string(b)
}

func pctEscaped(c byte) bool { return c < 0x21 || c > 0x7e || c == '"' || c == '%' }

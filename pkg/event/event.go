// Package event defines the CloudEvents 1.0 envelope kubebridge delivers
// and how it is built from an informer notification.
//
// Ids are stable: <uid>.<resourceVersion>.<type>, so a replay of the same
// state carries the same id and consumers (and JetStream) can dedupe. An
// Event is immutable once built and shared by every sink it goes to; its
// data (object, oldObject, RFC 6902 patch) is rendered lazily, on the sink's
// worker, never on the informer's goroutine.
package event

import (
	"encoding/json"
	"sync"
	"time"

	"github.com/wI2L/jsondiff"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// Type is the kind of change: what a consumer mirroring a rule's view does.
type Type string

// The event types.
const (
	Added   Type = "added"
	Updated Type = "updated"
	Deleted Type = "deleted"
)

// Values of the kbreplay and kbreason extensions.
const (
	ReplayResync     = "resync"
	ReplayCheckpoint = "checkpoint"
	ReasonUnmatched  = "unmatched" // the object left the rule's view; it still exists
)

// SpecVersion is the CloudEvents version of the envelope.
const SpecVersion = "1.0"

// Rule is what an event needs to know of the rule that produced it.
type Rule struct {
	Name            string
	Cluster         string
	GVR             schema.GroupVersionResource
	IncludeObject   bool
	IncludeOld      bool
	IncludePatch    bool
	IncludeMeta     bool // the object's apiVersion, kind and metadata only
	AllowSecretData bool
}

// Event is one CloudEvent. Build it with New.
type Event struct {
	ID      string
	Source  string
	Type    string // io.kubebridge.<resource>.<group or core>.<added|updated|deleted>
	Subject string // <namespace>/<name>, or <name> for cluster-scoped objects
	Time    time.Time

	// Extensions.
	Rule    string // kbrule
	Cluster string // kbcluster
	Replay  string // kbreplay: "", resync or checkpoint
	Reason  string // kbreason: "" or unmatched

	// Routing facts, not attributes of their own.
	Change    Type
	GVR       schema.GroupVersionResource
	Kind      string
	Namespace string
	Name      string
	UID       string
	// Key identifies the object within its rule: <rule>/<namespace>/<name>.
	// Queues coalesce and order by it.
	Key string

	rule      *Rule
	object    *unstructured.Unstructured
	oldObject *unstructured.Unstructured

	dataOnce sync.Once
	data     json.RawMessage
	dataErr  error

	encOnce sync.Once
	enc     []byte
	encErr  error
}

// New builds the event for a change of obj (old is the previous state, for
// updates) under rule r, observed at now. obj must not be modified afterwards:
// informer cache objects never are.
func New(r *Rule, change Type, obj, old *unstructured.Unstructured, now time.Time) *Event {
	ns, name := obj.GetNamespace(), obj.GetName()
	subject := name
	if ns != "" {
		subject = ns + "/" + name
	}
	group := r.GVR.Group
	if group == "" {
		group = "core"
	}
	e := &Event{
		ID:        string(obj.GetUID()) + "." + obj.GetResourceVersion() + "." + string(change),
		Source:    "kubebridge/" + r.Cluster,
		Type:      "io.kubebridge." + r.GVR.Resource + "." + group + "." + string(change),
		Subject:   subject,
		Time:      now.UTC(),
		Rule:      r.Name,
		Cluster:   r.Cluster,
		Change:    change,
		GVR:       r.GVR,
		Kind:      obj.GetKind(),
		Namespace: ns,
		Name:      name,
		UID:       string(obj.GetUID()),
		Key:       r.Name + "/" + subject,
		rule:      r,
		object:    obj,
		oldObject: old,
	}
	return e
}

// WithReplay returns a copy of e marked as a replay (kbreplay).
func (e *Event) WithReplay(replay string) *Event {
	c := e.clone()
	c.Replay = replay
	return c
}

// WithReason returns a copy of e with kbreason set.
func (e *Event) WithReason(reason string) *Event {
	c := e.clone()
	c.Reason = reason
	return c
}

func (e *Event) clone() *Event {
	return &Event{
		ID: e.ID, Source: e.Source, Type: e.Type, Subject: e.Subject, Time: e.Time,
		Rule: e.Rule, Cluster: e.Cluster, Replay: e.Replay, Reason: e.Reason,
		Change: e.Change, GVR: e.GVR, Kind: e.Kind, Namespace: e.Namespace, Name: e.Name, UID: e.UID, Key: e.Key,
		rule: e.rule, object: e.object, oldObject: e.oldObject,
	}
}

// RuleInfo returns the rule the event was built for.
func (e *Event) RuleInfo() *Rule { return e.rule }

// Object returns the object the event is about (its last state for deletes).
// Callers must not modify it.
func (e *Event) Object() *unstructured.Unstructured { return e.object }

// Data returns the event's data, {"object":…, "oldObject":…, "patch":[…]}
// as the rule's include says, with Secret values redacted unless the rule
// allows them. It is computed once, on first use.
func (e *Event) Data() (json.RawMessage, error) {
	e.dataOnce.Do(func() { e.data, e.dataErr = e.renderData() })
	return e.data, e.dataErr
}

type data struct {
	Object    map[string]any       `json:"object,omitempty"`
	OldObject map[string]any       `json:"oldObject,omitempty"`
	Patch     []jsondiff.Operation `json:"patch,omitempty"`
}

func (e *Event) renderData() (json.RawMessage, error) {
	r := e.rule
	redact := !r.AllowSecretData && isSecret(r.GVR)
	var d data
	if r.IncludeMeta && e.object != nil {
		d.Object = MetadataOnly(e.object.Object)
		if redact {
			d.Object = RedactSecret(d.Object)
		}
	}
	if r.IncludeObject && e.object != nil {
		d.Object = e.object.Object
		if redact {
			d.Object = RedactSecret(d.Object)
		}
	}
	if r.IncludeOld && e.oldObject != nil {
		d.OldObject = e.oldObject.Object
		if redact {
			d.OldObject = RedactSecret(d.OldObject)
		}
	}
	if r.IncludePatch && e.Change == Updated && e.oldObject != nil && e.object != nil {
		p, err := jsondiff.Compare(e.oldObject.Object, e.object.Object)
		if err != nil {
			return nil, err
		}
		if redact {
			p = redactPatch(p)
		}
		d.Patch = p
		if d.Patch == nil {
			d.Patch = []jsondiff.Operation{}
		}
	}
	return json.Marshal(d)
}

// MarshalJSON renders the event in CloudEvents structured JSON mode.
func (e *Event) MarshalJSON() ([]byte, error) { return e.Structured() }

// Structured returns the event in CloudEvents structured JSON mode. It is
// encoded once, on first use, and shared by every sink the event goes to;
// callers must not modify the bytes.
func (e *Event) Structured() ([]byte, error) {
	e.encOnce.Do(func() {
		d, err := e.Data()
		if err != nil {
			e.encErr = err
			return
		}
		b := make([]byte, 0, len(d)+400)
		b = append(b, `{"specversion":"1.0","id":`...)
		b = appendString(b, e.ID)
		b = append(b, `,"source":`...)
		b = appendString(b, e.Source)
		b = append(b, `,"type":`...)
		b = appendString(b, e.Type)
		b = append(b, `,"subject":`...)
		b = appendString(b, e.Subject)
		b = append(b, `,"time":"`...)
		b = e.Time.AppendFormat(b, time.RFC3339Nano)
		b = append(b, `","datacontenttype":"application/json","kbrule":`...)
		b = appendString(b, e.Rule)
		b = append(b, `,"kbcluster":`...)
		b = appendString(b, e.Cluster)
		if e.Replay != "" {
			b = append(b, `,"kbreplay":`...)
			b = appendString(b, e.Replay)
		}
		if e.Reason != "" {
			b = append(b, `,"kbreason":`...)
			b = appendString(b, e.Reason)
		}
		b = append(b, `,"data":`...)
		b = append(b, d...)
		e.enc = append(b, '}')
	})
	return e.enc, e.encErr
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

func isSecret(gvr schema.GroupVersionResource) bool {
	return gvr.Group == "" && gvr.Resource == "secrets"
}

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

// envelope is the structured-mode JSON form.
type envelope struct {
	SpecVersion     string          `json:"specversion"`
	ID              string          `json:"id"`
	Source          string          `json:"source"`
	Type            string          `json:"type"`
	Subject         string          `json:"subject"`
	Time            string          `json:"time"`
	DataContentType string          `json:"datacontenttype"`
	Rule            string          `json:"kbrule"`
	Cluster         string          `json:"kbcluster"`
	Replay          string          `json:"kbreplay,omitempty"`
	Reason          string          `json:"kbreason,omitempty"`
	Data            json.RawMessage `json:"data"`
}

// MarshalJSON renders the event in CloudEvents structured JSON mode.
func (e *Event) MarshalJSON() ([]byte, error) {
	d, err := e.Data()
	if err != nil {
		return nil, err
	}
	return json.Marshal(envelope{
		SpecVersion: SpecVersion, ID: e.ID, Source: e.Source, Type: e.Type, Subject: e.Subject,
		Time: e.Time.Format(time.RFC3339Nano), DataContentType: "application/json",
		Rule: e.Rule, Cluster: e.Cluster, Replay: e.Replay, Reason: e.Reason, Data: d,
	})
}

func isSecret(gvr schema.GroupVersionResource) bool {
	return gvr.Group == "" && gvr.Resource == "secrets"
}

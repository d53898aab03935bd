package mirror

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
)

// ResourceVersionAnnotation holds, on an object a ListerWatcher returns,
// the apiserver's resourceVersion of the object: its
// metadata.resourceVersion is the bucket revision instead (see the
// package doc).
const ResourceVersionAnnotation = "kubebridge.io/resource-version"

// Value is a key's value as a consumer reads it: the CloudEvent's
// attributes it names and data.object, undecoded.
type Value struct {
	SpecVersion string `json:"specversion"`
	ID          string `json:"id"`
	Source      string `json:"source"`
	Type        string `json:"type"`
	Subject     string `json:"subject"`
	Time        string `json:"time"`
	Rule        string `json:"kbrule"`
	Cluster     string `json:"kbcluster"`
	// Truncated is set on a marker (TruncatedExtension): why the object
	// was cut to its identity.
	Truncated string `json:"kbtruncated"`
	// Object is data.object: the Kubernetes object as the rule includes
	// it, a JSON object.
	Object json.RawMessage `json:"-"`
}

// ParseValue reads a key's value. It refuses anything that is not a JSON
// object whose data.object is a JSON object (a foreign writer's value, a
// value cut short): consumers skip those.
func ParseValue(b []byte) (*Value, error) {
	var v struct {
		Value
		Data *struct {
			Object json.RawMessage `json:"object"`
		} `json:"data"`
	}
	if err := json.Unmarshal(b, &v); err != nil {
		return nil, fmt.Errorf("value is not a JSON CloudEvent: %w", err)
	}
	if v.Data == nil {
		return nil, errNoData
	}
	obj := bytes.TrimSpace(v.Data.Object)
	if len(obj) == 0 || obj[0] != '{' {
		return nil, errNoObject
	}
	v.Value.Object = obj
	return &v.Value, nil
}

var (
	errNoData   = errors.New("value has no data")
	errNoObject = errors.New("value's data.object is not a JSON object")
)

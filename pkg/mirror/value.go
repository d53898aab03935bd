package mirror

// A key's value is the CloudEvent (structured JSON, as the nats sink
// publishes it) of the object's latest transition into or within the
// view: data.object is the object as the rule includes it. An object whose
// event is larger than the bucket takes is stored as a marker instead: the
// same event with data.object cut to apiVersion, kind and metadata (name,
// namespace, uid, resourceVersion, labels), the annotation
// TruncatedAnnotation saying why, and the extension TruncatedExtension;
// the next change that fits replaces it.
const (
	// TruncatedAnnotation is set on a marker's object: the event's size
	// and the limit it exceeded ("1572864 bytes > 1048576").
	TruncatedAnnotation = "kubebridge.io/mirror-truncated"
	// TruncatedExtension is the CloudEvents extension a marker carries,
	// with the same text.
	TruncatedExtension = "kbtruncated"
)

// Package mirror reads a rule's view from the bus: the NATS KV bucket a
// nats sink with mirror set keeps per rule (one key per object in the
// view, its latest event as the value, removed when the object leaves the
// view). It lays out the bucket's keys (Key, ParseKey) and values
// (ParseValue), shared by the sink that writes them and the consumers that
// read them, and implements client-go's ListerWatcher over a bucket, so
// that a consumer runs a SharedIndexInformer on the bus instead of the
// apiserver:
//
//	kv, _ := js.KeyValue(ctx, "kubebridge-myrule")
//	lw := mirror.NewListerWatcher(kv, mirror.Options{Object: &corev1.ConfigMap{}})
//	inf := cache.NewSharedIndexInformer(lw, &corev1.ConfigMap{}, 0, cache.Indexers{})
//
// # The bucket
//
// A key is <namespace>.<name>, escaped (Key), "_" as the namespace of a
// cluster-scoped object. Keys starting with ReservedPrefix are the
// bridge's own; consumers skip them. A value is the CloudEvent (structured
// JSON) of the object's latest transition; data.object is the object. An
// object whose event is too large is a marker: data.object cut to
// apiVersion, kind and metadata, with TruncatedAnnotation. An object that
// leaves the view is a deletion of its key (a delete marker). The bucket
// has History 1: a key's revision is the stream sequence of its last
// write, and the revisions of one bucket only grow.
//
// # resourceVersion
//
// The ListerWatcher's resourceVersions are bucket revisions, never the
// apiserver's: a list's is the revision it reflects, a watch resumes after
// the revision it is given, and every object it returns has its
// metadata.resourceVersion set to the revision of its value, the
// apiserver's kept in ResourceVersionAnnotation. It has to be so: a
// reflector resumes its watch from the resourceVersion of the last object
// it received, and an apiserver's resourceVersion means nothing to the
// bucket. So, in a consumer, compare resourceVersions only with others
// from the same bucket; read the annotation for the apiserver's.
//
// # Watches
//
// A watch sends, in revision order, a put as Modified (an informer makes it
// an add when it does not hold the object) and a deletion as Deleted: a
// deletion carries no value, so its object has only the kind, the
// namespace, the name and the deletion's revision as resourceVersion (a handler that needs
// the last state keeps it). A value that does not read (a foreign writer, a
// value too large for Options.MaxValueBytes, another kind) reads as no
// object: skipped in a list, a Deleted in a watch, counted in Skips and
// logged. Reserved keys are skipped, their revisions still passed. With
// AllowWatchBookmarks, a watch sends a bookmark every
// Options.BookmarkInterval when its revision moved and before its timeout
// ends it. Watch-list (SendInitialEvents, client-go's WatchListClient,
// on by default) is served: the objects as Added, then a bookmark
// annotated k8s.io/initial-events-end, then the changes.
//
// # Compaction and 410 Gone
//
// The writer purges deletion markers older than a retention, after
// raising CompactedKey to the highest revision it purges. A watch from a
// revision below it is refused with 410 Gone (resource expired), and a
// reflector lists again. A compaction while a watch runs is caught too: a
// revision the watch finds missing (superseded, or purged) at or below the
// compaction (read again after the gap is seen) ends the watch with a
// watch.Error event carrying the 410 status; a list overtaken by a
// compaction past the revision it started from is refused the same way. A revision past the bucket's
// last (a bucket recreated) is "too large resource version", which also
// makes the reflector list again. So an informer over a mirror ends equal
// to the bucket through restarts, compactions and reconnects, as it does
// over an apiserver.
//
// A watch ends at its timeout (options.TimeoutSeconds), at Stop, when its
// context ends, or when NATS closes it; its goroutine is awaited by Stop,
// which also deletes the server's consumer. A NATS server restart within a
// watch is ridden out by the watch's ordered consumer, which notices by
// missed heartbeats (some 20 s) and resumes where it was.
package mirror

// Package view owns, per sink and rule, the view the sink has been handed
// (every object it was told is in the rule's view: uid, resourceVersion,
// entry time, last state), and the one diff that turns (desired state,
// handed view) into transitions. The rules stage (internal/stage) hands it
// the desired state, evaluated once for every sink of the rule; the view
// only diffs. Every trigger calls it: live
// notifications, relists, restarts and leader take-over (after Load from the
// checkpoint), hot reload, namespace label changes and replays. So a
// consumer applying a rule's events ends up holding exactly the rule's view,
// whatever happened in between.
//
// The diff is level-based, like a Kubernetes controller's reconcile: it
// compares the desired state of one object key (the state a live
// notification carries, else the cache's) with what the sink was handed,
// whatever the trigger:
//
//   - another uid under a key: deleted(old uid), then added(new uid);
//   - in the view, not handed: added; handed, no longer in the view:
//     deleted (kbreason "unmatched" while the object still exists);
//   - same uid, another resourceVersion: updated (old = the state handed).
//
// A rule's events, changed and where decide which transitions are sent
// (the stage judges them); the others still pass through the sink's queue, marked Quiet, so that what is
// recorded as acknowledged is the whole view, in order.
//
// A live notification is synced with its own object, so that a sink that
// keeps up receives every change; other triggers read the informer cache's
// current state. Sync holds the sink's lock while it reads the desired state
// and offers the transitions, and skips a notification older than what the
// sink was handed (resourceVersions are ordered within a resource:
// apimachinery's CompareResourceVersion), so concurrent triggers for one key
// never hand a sink an older state after a newer one.
package view

import (
	"slices"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/resourceversion"

	"github.com/kubebridge/kubebridge/internal/checkpoint"
	"github.com/kubebridge/kubebridge/internal/stage"
	"github.com/kubebridge/kubebridge/pkg/event"
)

// Offer hands an event to the sink's queue. It must not block.
type Offer func(ev *event.Event)

// held is one incarnation of an object the sink has been handed. Its uid
// and resourceVersion are read from obj: the informer's cached object, shared
// rather than copied (an entry costs a few words per object and sink).
type held struct {
	obj     *unstructured.Unstructured // the state handed; from a checkpoint, its metadata only; nil: none
	entered int64                      // when it entered the view: the object's, kept by every reload (event.Entered)
	stamp   int64                      // its ids' stamp (event.Stamp)
	partial bool                       // obj is rebuilt from a checkpoint: no old state for updates
	// mayBeGone: from a checkpoint with an intent of the same uid (its
	// deletion, or a re-entry, was sent unacknowledged): the sink may not
	// hold it, so if it is in the view it is sent as added again.
	mayBeGone bool
	// left: from a checkpoint whose newest intent of the uid is its leaving
	// the view (a deletion, kbreason unmatched): back in the view, it
	// enters anew.
	left bool
}

func (h *held) uid() string { return string(h.obj.GetUID()) }

// slot is what a sink was handed of one object key, stored by value: the
// incarnation it holds is inline, so that a sync reads the map's memory
// and the object, nothing in between.
type slot struct {
	cur   held   // cur.obj nil: nothing handed
	extra *extra // rarely set
}

// extra holds what few slots need.
type extra struct {
	ghosts []held // from a checkpoint: incarnations sent but not acknowledged
	// floor is the resourceVersion of an object handed as deleted
	// (unmatched) while it still exists: a lagging notification older than
	// it must not bring the older state back. Kept until the object is
	// deleted or re-enters; bounded by the objects in the cache.
	floorUID, floor string
}

func (sl slot) ghosts() []held {
	if sl.extra == nil {
		return nil
	}
	return sl.extra.ghosts
}

func (sl slot) floor() (uid, rv string) {
	if sl.extra == nil {
		return "", ""
	}
	return sl.extra.floorUID, sl.extra.floor
}

// Handed is what one sink was handed: its views, per rule name (not a
// sink: what the sink holds, and the diff that changes it).
type Handed struct {
	Name string

	mu    sync.Mutex
	ready bool
	offer Offer
	views map[string]map[string]slot // rule -> object key -> slot
	// loaded are the rules whose views were read from a checkpoint or a
	// destination (Load, Merge), not only synced.
	loaded map[string]bool
}

// NewHanded returns the empty, not yet ready views of a sink whose events go
// to offer.
func NewHanded(name string, offer Offer) *Handed {
	return &Handed{Name: name, offer: offer, views: map[string]map[string]slot{}, loaded: map[string]bool{}}
}

// Load sets what the sink holds of rule from its checkpoint.
//
// An object keeps the time it entered the view (a request's for counts
// from it, templates read it as event.entered): a restart, a reload or a
// handover is not a change of the object. Only its ids' stamp may change
// (see Sync).
func (s *Handed) Load(rule string, stored map[string]*checkpoint.Slot) {
	s.mu.Lock()
	defer s.mu.Unlock()
	v := make(map[string]slot, len(stored))
	for k, st := range stored {
		if sl, ok := loaded(st); ok {
			v[k] = sl
		}
	}
	s.views[rule] = v
}

// Loaded reports whether what the sink holds of rule was read (Load,
// Merge) since the rule came to it.
func (s *Handed) Loaded(rule string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.loaded[rule]
}

// Merge adds to what the sink holds of rule, as it runs, what its
// destination was found to hold besides (sinks.Holder, read late because
// the destination was unreachable at the start): the keys it was not
// known to hold, and the incarnations it holds under a key other than
// those known there, as incarnations to delete. What is known stays: it
// is newer than what the destination held when read (a send in flight).
// A reconciliation of the rule should follow.
func (s *Handed) Merge(rule string, found map[string]*checkpoint.Slot) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.loaded[rule] = true
	v := s.views[rule]
	if v == nil {
		v = map[string]slot{}
		s.views[rule] = v
	}
	for k, st := range found {
		add, ok := loaded(st)
		if !ok {
			continue
		}
		sl, known := v[k]
		if !known {
			v[k] = add
			continue
		}
		if sl.cur.obj == nil && add.cur.obj != nil {
			sl.cur = add.cur // known by a floor alone: nothing handed there
		}
		has := func(uid string) bool {
			if sl.cur.obj != nil && sl.cur.uid() == uid {
				return true
			}
			return slices.ContainsFunc(sl.ghosts(), func(g held) bool { return g.uid() == uid })
		}
		for _, h := range append([]held{add.cur}, add.ghosts()...) {
			if h.obj == nil || has(h.uid()) {
				continue
			}
			if sl.extra == nil {
				sl.extra = &extra{}
			} else {
				e := *sl.extra
				sl.extra = &e
			}
			sl.extra.ghosts = append(slices.Clip(sl.extra.ghosts), h)
		}
		v[k] = sl
	}
}

// loaded is the slot of what a checkpoint (or a destination) says a sink
// holds of one key; ok is false when it holds nothing there.
func loaded(st *checkpoint.Slot) (slot, bool) {
	var sl slot
	if a := st.Acked; a != nil {
		sl.cur = held{obj: lastKnown(*a), entered: a.Entered, stamp: a.IDStamp(), partial: true}
	}
	var ghosts []held
	for _, p := range st.Pending {
		if sl.cur.obj != nil && p.UID == sl.cur.uid() {
			sl.cur.mayBeGone = true
			sl.cur.stamp = max(sl.cur.stamp, p.IDStamp()) // ids of the newest stamp: never one sent before it
			sl.cur.entered, sl.cur.left = newer(sl.cur.entered, sl.cur.left, p)
			continue
		}
		ghosts = append(ghosts, held{obj: lastKnown(p), entered: p.Entered, stamp: p.IDStamp(), partial: true})
	}
	for i := range ghosts { // whether each ghost's uid left the view last
		var entered int64
		left := false
		for _, p := range st.Pending {
			if p.UID == ghosts[i].uid() {
				entered, left = newer(entered, left, p)
			}
		}
		ghosts[i].left = left
	}
	if len(ghosts) > 0 {
		sl.extra = &extra{ghosts: ghosts}
	}
	return sl, sl.cur.obj != nil || sl.extra != nil
}

// newer folds intent p into what is known of its uid's last move (entered:
// its newest entry; left: the newest intent is its leaving). A leaving
// carries the entry time of the incarnation that left, so it wins a tie: a
// re-entry since would carry a later one.
func newer(entered int64, left bool, p checkpoint.Entry) (int64, bool) {
	switch {
	case p.Entered > entered:
		return p.Entered, p.Leaving
	case p.Entered == entered:
		return entered, left || p.Leaving
	}
	return entered, left
}

// Start lets Sync work; before it (and after Stop), Sync does nothing: the
// reconciliation that follows Start covers what it skipped.
func (s *Handed) Start() {
	s.mu.Lock()
	s.ready = true
	s.mu.Unlock()
}

// Stop makes Sync do nothing from now on.
func (s *Handed) Stop() {
	s.mu.Lock()
	s.ready = false
	s.mu.Unlock()
}

// Forget drops the views of rules not in keep (removed by a reload).
func (s *Handed) Forget(keep func(rule string) bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for r := range s.views {
		if !keep(r) {
			delete(s.views, r)
		}
	}
	for r := range s.loaded {
		if !keep(r) {
			delete(s.loaded, r)
		}
	}
}

// Keys returns the object keys the sink was handed under rule.
func (s *Handed) Keys(rule string) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	keys := make([]string, 0, len(s.views[rule]))
	for k := range s.views[rule] {
		keys = append(keys, k)
	}
	return keys
}

// Len returns how many objects the sink holds under rule.
func (s *Handed) Len(rule string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, sl := range s.views[rule] {
		if sl.cur.obj != nil {
			n++
		}
	}
	return n
}

// Sync brings what the sink was handed of d's key under d's rule to the
// desired state the rules stage evaluated (internal/stage), offering the
// transitions. It returns how many events are to be sent (not quiet).
//
// It runs once per notification and sink: it diffs, and nothing else (the
// stage judged the state, and judges and builds the events, once for
// every sink of the rule). It reads the uid and resourceVersion of each
// state once, writes the view's map only when the slot changes, and hands
// the key to the events as their subject.
func (s *Handed) Sync(d *stage.Desired) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.ready {
		return 0
	}
	r, key, t := d.Rule, d.Key, &d.Trigger
	v := s.views[r.Name]
	if v == nil {
		v = map[string]slot{}
		s.views[r.Name] = v
	}
	sl := v[key]
	floorUID, floor := sl.floor()
	var curUID, curRV string // of what the sink holds
	if sl.cur.obj != nil {
		curUID, curRV = uidRV(sl.cur.obj)
	}
	if t.Gone != nil { // a deletion: of the incarnation the sink holds, or news to it
		if sl.cur.obj == nil && len(sl.ghosts()) == 0 && sl.extra != nil {
			delete(v, key) // at most a floor: the object is gone
		}
		if sl.cur.obj == nil || curUID != string(t.Gone.GetUID()) {
			return 0
		}
	}
	obj, objUID, objRV, in := d.State(s.Name) // under the lock: see stage.Desired.State
	exists := obj != nil
	if t.Object != nil {
		if sl.cur.obj != nil && older(objRV, curRV) {
			return 0 // another trigger already handed a newer state
		}
		if floorUID == objUID && older(objRV, floor) {
			return 0 // older than a deletion another trigger handed
		}
	}
	var desired *unstructured.Unstructured // obj, when in the view
	if in {
		desired = obj
	}
	if t.Initial && desired == nil {
		return 0
	}
	e := emitter{s: s, now: t.Now, replay: t.Replay, key: key, obj: t.Object, meta: t.Meta}
	now := t.Now.UnixNano()
	var reentered int64 // of a ghost of objUID that did not leave the view: when it entered
	cur, has := sl.cur, sl.cur.obj != nil
	for _, g := range sl.ghosts() {
		if desired != nil && g.uid() == objUID && (!has || curUID != g.uid()) {
			if !g.left {
				reentered = max(reentered, g.entered)
			}
			continue // the added below puts it back, under a new stamp (see updated)
		}
		tr, partial := event.Transition{Change: event.Deleted, Object: g.obj, Entered: g.entered, Stamp: g.stamp}, true
		if exists && objUID == g.uid() { // still there, out of the view
			tr.Object, tr.Reason, partial = obj, event.ReasonUnmatched, false
		}
		e.emit(d, tr, partial)
	}
	if has && (desired == nil || curUID != objUID) {
		tr := event.Transition{Change: event.Deleted, Object: cur.obj, Entered: cur.entered, Stamp: cur.stamp}
		partial := cur.partial
		switch {
		case exists && objUID == curUID: // still there, out of the view
			tr.Object, tr.Reason, partial = obj, event.ReasonUnmatched, false
			if !cur.partial {
				tr.Old = cur.obj
			}
			floorUID, floor = curUID, objRV
		case t.Gone != nil && string(t.Gone.GetUID()) == curUID:
			tr.Object, partial = t.Gone, false
		}
		e.emit(d, tr, partial)
		has = false
	}
	switch {
	case desired == nil:
	case !has:
		// Fresh: nothing of the key was ever handed (no ghost, no floor, and
		// no deletion just emitted above), so the sink holds nothing of it.
		fresh := sl.cur.obj == nil && sl.extra == nil
		cur, has = held{entered: now, stamp: now}, true
		if reentered != 0 { // sent before the checkpoint's load, never left: still in the view since then
			cur.entered = reentered
		}
		e.emit(d, event.Transition{Change: event.Added, Object: desired, Entered: cur.entered, Stamp: cur.stamp, Fresh: fresh}, false)
	case cur.mayBeGone:
		// Its deletion may have reached the sink: send it again as added,
		// under a new stamp; it entered anew only if it had left.
		if cur.left {
			cur.entered = now
		}
		cur.stamp = now
		e.emit(d, event.Transition{Change: event.Added, Object: desired, Entered: cur.entered, Stamp: cur.stamp}, false)
	case curRV != objRV || t.Replay == event.ReplayResync:
		change := event.Updated
		if t.Replay == event.ReplayResync && !r.Delivers(event.Updated) && r.Delivers(event.Added) {
			// A replay re-asserts the object as the rule sends it: an alert
			// kept alive by re-sends must not expire because its rule sends
			// no updates.
			change = event.Added
		}
		if curRV == objRV && !r.Delivers(change) {
			break // a replay of what the rule does not send: nothing to record
		}
		if cur.partial {
			// Loaded from a checkpoint, which may lag what the consumer got (a
			// deletion sent before the crash, its acknowledgement not yet
			// written): reusing this incarnation's ids could repeat the id of
			// an earlier update, which a deduplicating consumer would drop
			// after that deletion. A new stamp is safe either way; the
			// object has been in the view since it entered.
			cur.stamp = now
		}
		tr := event.Transition{Change: change, Object: desired, Entered: cur.entered, Stamp: cur.stamp}
		if change == event.Updated && !cur.partial && curRV != objRV {
			tr.Old = cur.obj
		}
		e.emit(d, tr, false)
	}
	if !has {
		switch {
		case floor != "" && exists && objUID == floorUID:
			v[key] = slot{extra: &extra{floorUID: floorUID, floor: floor}}
		case sl != (slot{}): // else there is nothing to delete
			delete(v, key)
		}
		return e.sent
	}
	cur.obj, cur.partial, cur.mayBeGone, cur.left = desired, false, false, false
	if sl.cur != cur || sl.extra != nil { // else the map holds it already
		v[key] = slot{cur: cur}
	}
	return e.sent
}

// emitter offers one Sync's transitions, counting those to be sent.
type emitter struct {
	s           *Handed
	now         time.Time
	replay, key string
	obj         *unstructured.Unstructured // the trigger's object, whose Meta is meta (zero: unknown)
	meta        event.Meta
	sent        int
}

// emit offers a transition, quiet when the rules stage (d) says the rule
// does not send it; partial says its object is only the metadata a
// checkpoint kept (see stage.Desired.Quiet). d is a parameter, not a field
// of the emitter, so that it stays on its caller's stack.
func (e *emitter) emit(d *stage.Desired, tr event.Transition, partial bool) {
	tr.Time, tr.Replay, tr.Subject = e.now, e.replay, e.key
	if tr.Object == e.obj {
		tr.Meta = e.meta
	}
	tr.Quiet = d.Quiet(tr, partial)
	if !tr.Quiet {
		e.sent++
	}
	e.s.offer(d.Event(tr))
}

// uidRV reads an object's uid and resourceVersion (as GetUID and
// GetResourceVersion do) with one lookup of its metadata.
func uidRV(u *unstructured.Unstructured) (uid, rv string) {
	md, _ := u.Object["metadata"].(map[string]any)
	uid, _ = md["uid"].(string)
	rv, _ = md["resourceVersion"].(string)
	return uid, rv
}

// older reports whether resourceVersion a is before b. Versions that are
// not the apiserver's integers (some aggregated APIs) are never older.
func older(a, b string) bool {
	c, err := resourceversion.CompareResourceVersion(a, b)
	return err == nil && c < 0
}

// lastKnown rebuilds the metadata of an object from its checkpoint entry.
// It has no apiVersion and kind (the checkpoint keeps neither): the events
// built from it take the rule's resource's (event.Rule.ResourceKind).
func lastKnown(e checkpoint.Entry) *unstructured.Unstructured {
	u := &unstructured.Unstructured{Object: map[string]any{}}
	u.SetNamespace(e.Namespace)
	u.SetName(e.Name)
	u.SetUID(types.UID(e.UID))
	if e.ResourceVersion != "" {
		u.SetResourceVersion(e.ResourceVersion)
	}
	if len(e.Labels) > 0 {
		u.SetLabels(e.Labels)
	}
	return u
}

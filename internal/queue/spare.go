package queue

// spare keeps up to limit freed nodes and groups for reuse, so that a
// queue cycling through its capacity allocates nothing once warm. It is
// guarded by the queue's mu.
type spare[T any] struct {
	limit   int
	nodes   *node[T] // linked by next
	groups  *group[T]
	nNodes  int
	nGroups int
}

// node returns a zero node.
func (s *spare[T]) node() *node[T] {
	if n := s.nodes; n != nil {
		s.nodes, n.next = n.next, nil
		s.nNodes--
		return n
	}
	return &node[T]{}
}

// putNode zeroes n and keeps it, if there is room.
func (s *spare[T]) putNode(n *node[T]) {
	*n = node[T]{}
	if s.nNodes < s.limit {
		n.next = s.nodes
		s.nodes = n
		s.nNodes++
	}
}

// group returns an empty group named key, not in the ready heap.
func (s *spare[T]) group(key string) *group[T] {
	g := s.groups
	if g != nil {
		s.groups, g.next = g.next, nil
		s.nGroups--
	} else {
		g = &group[T]{}
	}
	g.key, g.idx = key, -1
	return g
}

// putGroup empties g and keeps it, if there is room. Its claim
// generation stays: a stale Claim on it must still release nothing.
func (s *spare[T]) putGroup(g *group[T]) {
	*g = group[T]{gen: g.gen}
	if s.nGroups < s.limit {
		g.next = s.groups
		s.groups = g
		s.nGroups++
	}
}

// signals wake the takes that wait: for an item, for Close, for the
// queue to drain. Its flags are guarded by the queue's mu.
type signals struct {
	wake      chan struct{} // signalled (non-blocking) when an item may be taken
	closed    chan struct{} // closed by Close, wakes every waiter
	drained   chan struct{} // closed once the queue is closed and empty
	isClosed  bool
	isDrained bool
}

func newSignals() signals {
	return signals{wake: make(chan struct{}, 1), closed: make(chan struct{}), drained: make(chan struct{})}
}

func (s *signals) signal() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// close marks the queue closed, once; empty says it is drained too.
func (s *signals) close(empty bool) {
	if s.isClosed {
		return
	}
	s.isClosed = true
	close(s.closed)
	if empty {
		s.drain()
	}
}

// drain wakes every waiter once the queue is closed and empty.
func (s *signals) drain() {
	if !s.isDrained {
		s.isDrained = true
		close(s.drained)
	}
}

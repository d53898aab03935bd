package fieldpath

// Get returns the value a concrete path (one that Changes named)
// selects in obj.
func (p Path) Get(obj map[string]any) (any, bool) {
	if p.fields {
		return p.lookup(obj)
	}
	m, _ := collect(obj, p.segs)
	for _, v := range m {
		return v, true
	}
	return nil, false
}

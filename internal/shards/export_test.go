package shards

// Freeze stops the loop without releasing anything or telling the
// handler: the replica as the others see it when it was killed or frozen.
func (o *Owner) Freeze() {
	o.stop()
	o.loop.Wait()
}

package reconcile

// Tokens is how many queries channel ch's budget could make at once now:
// the background's, or (manual) Ask's.
func Tokens(r *Reconciler, ch string, manual bool) float64 { return r.limiter(ch, manual).Tokens() }

package channel

// FieldRulesHold reports whether an accepted delivery satisfies the field
// rules every adapter guarantees: for the fuzz targets, which live outside
// the package so that they can use the channeltest signers.
func FieldRulesHold(d *Delivery) bool {
	return printableASCII(d.TxnID, 64) && printableASCII(d.OrderNo, 64) && isCurrency(d.Currency) &&
		d.Amount > 0 && d.Amount <= maxSafeInteger && channelEvent(d.Event) && len(d.Key) <= 160
}

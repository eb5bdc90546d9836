package admin

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"reflect"
	"strings"
)

// fieldError is an admin body's fault, named by the one field at fault
// ("body" when the body as a whole is not one JSON object).
type fieldError struct {
	field, msg string
}

func (e *fieldError) Error() string { return e.field + ": " + e.msg }

func fieldErr(field, msg string) error { return &fieldError{field: field, msg: msg} }

// decodeStrict decodes one JSON object into v, a pointer to a struct, by
// the callback body's rules and stricter: a repeated key, a key that
// matches a field only by case, an unknown key and anything after the
// object are refused (encoding/json alone keeps a repeated key's last value
// and folds case, so {"amount":1,"Amount":2} would mean 2). Errors are
// *fieldError, naming the key or field at fault.
func decodeStrict(body []byte, v any) error {
	fields := jsonFields(v)
	dec := json.NewDecoder(bytes.NewReader(body))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return fieldErr("body", "must be one JSON object")
	}
	seen := make(map[string]bool, len(fields))
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return fieldErr("body", "must be one JSON object")
		}
		key := tok.(string) // inside an object, json.Decoder yields keys as strings
		if !fields[key] {
			for f := range fields {
				if strings.EqualFold(f, key) {
					return fieldErr(key, "unknown key (keys are case-sensitive: "+f+")")
				}
			}
			return fieldErr(keyName(key), "unknown key")
		}
		if seen[key] {
			return fieldErr(key, "repeated key")
		}
		seen[key] = true
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return fieldErr("body", "must be one JSON object")
		}
	}
	if tok, err := dec.Token(); err != nil || tok != json.Delim('}') {
		return fieldErr("body", "must be one JSON object")
	}
	if _, err := dec.Token(); err != io.EOF {
		return fieldErr("body", "data after the JSON object")
	}
	if err := json.Unmarshal(body, v); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) && te.Field != "" {
			return fieldErr(te.Field, "must be a JSON "+jsonKind(te.Type))
		}
		return fieldErr("body", "must be one JSON object")
	}
	return nil
}

// keyName shows an unknown key in an error: quoted when empty, cut when
// long (it is the sender's text, echoed back).
func keyName(k string) string {
	switch {
	case k == "":
		return `""`
	case len(k) > 64:
		return k[:64] + "..."
	}
	return k
}

// jsonFields lists the JSON names of the fields of the struct v points to.
func jsonFields(v any) map[string]bool {
	t := reflect.TypeOf(v).Elem()
	out := make(map[string]bool, t.NumField())
	for i := range t.NumField() {
		name, _, _ := strings.Cut(t.Field(i).Tag.Get("json"), ",")
		if name == "" {
			name = t.Field(i).Name
		}
		if name != "-" {
			out[name] = true
		}
	}
	return out
}

// jsonKind names the JSON value a Go type takes.
func jsonKind(t reflect.Type) string {
	switch t.Kind() {
	case reflect.String:
		return "string"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Float32, reflect.Float64:
		return "number"
	case reflect.Bool:
		return "boolean"
	}
	return "value of another type"
}

// requiredText checks an operator's free text (a resolution, a name):
// present, without NUL (Postgres text cannot hold it).
func requiredText(field, s string) error {
	switch {
	case s == "":
		return fieldErr(field, "required, non-empty")
	case strings.ContainsRune(s, 0):
		return fieldErr(field, "must not contain NUL")
	}
	return nil
}

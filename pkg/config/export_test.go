package config

// ValidateTree lets the external tests re-run the validation walk.
var ValidateTree = validateTree

// Validates an AsyncAPI document with the AsyncAPI Initiative's own parser, Avro
// payloads included (their $refs to schemas/*.avsc are resolved and parsed as Avro).
// Usage: node validate.mjs ../../../docs/asyncapi.yaml
// Prints each diagnostic; exits 1 on any error, and prints a summary line on success.
import { Parser, fromFile, DiagnosticSeverity } from '@asyncapi/parser';
import { AvroSchemaParser } from '@asyncapi/avro-schema-parser';

const file = process.argv[2];
const parser = new Parser();
parser.registerSchemaParser(AvroSchemaParser());
const { document, diagnostics } = await fromFile(parser, file).parse();
let errors = 0;
for (const d of diagnostics) {
  const where = d.path && d.path.length ? d.path.join('.') : '(document)';
  const level = ['error', 'warning', 'information', 'hint'][d.severity] ?? d.severity;
  if (d.severity === DiagnosticSeverity.Error) errors += 1;
  console.log(`${level}: ${where}: ${d.message}`);
}
if (!document || errors > 0) {
  console.log(`INVALID: ${errors} error(s)`);
  process.exit(1);
}
const channels = document.channels().length;
const operations = document.operations().length;
const messages = document.allMessages().length;
console.log(`VALID: ${channels} channels, ${operations} operations, ${messages} messages`);

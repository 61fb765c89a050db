// Validates an AsyncAPI document (the file named by the first argument) with the AsyncAPI
// Initiative's own parser (the specification's schema and its rules), then each message's
// examples against that message's headers and payload schemas (JSON Schema, with ajv: the
// parser itself does not check examples). Prints every finding; exits 1 on an error or a
// warning, or an example that does not match.
import { readFileSync } from 'node:fs';
import { Parser, DiagnosticSeverity } from '@asyncapi/parser';
import Ajv from 'ajv';
import addFormats from 'ajv-formats';

const { document, diagnostics } = await new Parser().parse(readFileSync(process.argv[2], 'utf8'));
let failed = !document;
for (const d of diagnostics) {
  console.log(`${DiagnosticSeverity[d.severity]} ${d.code} at ${d.path.join('.')}: ${d.message}`);
  failed ||= d.severity === DiagnosticSeverity.Error || d.severity === DiagnosticSeverity.Warning;
}
if (document) {
  const ajv = new Ajv({ strict: false, allErrors: true });
  addFormats(ajv);
  let examples = 0;
  for (const message of document.components().messages()) {
    for (const example of message.examples()) {
      for (const [part, schema, value] of [
        ['headers', message.headers()?.json(), example.headers()],
        ['payload', message.payload()?.json(), example.payload()],
      ]) {
        if (value === undefined) continue;
        examples += 1;
        if (schema && !ajv.validate(schema, value)) {
          failed = true;
          console.log(`example "${example.name()}" of ${message.id()}: its ${part} do not match:`);
          console.log(ajv.errorsText(ajv.errors, { separator: '\n  ' }));
        }
      }
    }
  }
  console.log(`${document.components().messages().length} messages, ${examples} example parts checked`);
}
process.exit(failed ? 1 : 0);
